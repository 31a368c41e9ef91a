"""A paged KV cache: one pool of fixed-size blocks per layer, read through block tables (chapter 12).

A static cache (chapter 5) gives every sequence `max_seq_len` rows up front; most of them are never
written. Here a layer's keys and values live in a pool `[n, bs, kv, hd]` of n blocks of bs positions
each. A sequence owns a list of block ids, its block table; its position p lives in block
`table[p // bs]` at offset `p % bs`, which flattens to the slot `table[p // bs] · bs + p % bs` of the
pool seen as `[(n bs), kv, hd]`. Blocks are handed out as a sequence grows, so a sequence holds at most
bs - 1 unused positions (Kwon et al. 2023, "Efficient Memory Management for Large Language Model
Serving with PagedAttention", section 4; nano-vllm keeps one such pool for all layers and sizes it
by the memory left after the weights, GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/model_runner.py`
103–121, `allocate_kv_cache`).

Reading: the blocks of a row's table are gathered into a contiguous `[b, kv, s, hd]` (s = the table's
length times bs) and the model's own `scaled_dot_product_attention` runs on them under the view's
mask. The engine packs every sequence of a step into one row (b = 1, t = all new tokens of the step,
the table = all their tables one after the other) and the mask lets a query see only keys of its own
sequence at positions up to its own: one forward per step, whatever mix of prefill chunks and decode
tokens it holds (vLLM's flattened batch). On a GPU a paged kernel (vLLM's PagedAttention, FlashInfer,
FlexAttention's paged path) reads the blocks in place instead of copying them, and reads only a
query's own blocks; on a CPU the copy is a small share of a step (chapter 12 measures it).

Shapes: pool `[n, bs, kv, hd]`; k, v in `[b, kv, t, hd]`; slots `[b, t]` (-1: a pad, not written, with pads=True);
block_tables `[b, m]`; mask `[b, t, (m bs)]`; out `[b, kv, (m bs), hd]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn


@dataclass(frozen=True)
class PagedView:
    """What one forward over a paged cache needs to know, for b rows of t new tokens.

    positions `[b, t]`: each new token's position in its sequence (rotary angles); slots `[b, t]`: the
    pool slot its key and value go to (-1 for a pad); block_tables `[b, m]`: the blocks each row reads,
    in order; block_size: positions per block; mask `[b, t, (m bs)]`: True where a new token may attend
    to a key read through the table."""

    positions: torch.Tensor
    slots: torch.Tensor
    block_tables: torch.Tensor
    block_size: int
    mask: torch.Tensor
    pads: bool = False  # whether any slot is -1 (the engine packs its steps without pads)


class PagedKVCache(nn.Module):
    def __init__(
        self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, device=None, dtype=None
    ):
        super().__init__()
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        # zeros, not empty: a masked key still multiplies its value by a zero weight, and 0 · NaN is NaN
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    def update(self, view: PagedView, k: torch.Tensor, v: torch.Tensor):
        """Write the new keys and values `[b, kv, t, hd]` to their slots; return each row's keys and
        values gathered through its block table, `[b, kv, s, hd]` (the mask hides what the row has not written)."""
        slots = view.slots.reshape(-1)
        if view.pads:  # padded rows: only the real tokens are written
            real = slots >= 0
            slots, k, v = slots[real], k.transpose(1, 2)[view.slots >= 0], v.transpose(1, 2)[view.slots >= 0]
        else:
            k, v = rearrange(k, "b kv t hd -> (b t) kv hd"), rearrange(v, "b kv t hd -> (b t) kv hd")
        b, m = view.block_tables.shape
        out = []
        for pool, new in ((self.k, k), (self.v, v)):
            pool.view(-1, *pool.shape[2:]).index_copy_(0, slots, new)
            # one copy: the table's blocks in order, then a view with the heads first
            blocks = pool.index_select(0, view.block_tables.reshape(-1))  # [(b m), bs, kv, hd]
            out.append(blocks.view(b, m * pool.shape[1], *pool.shape[2:]).transpose(1, 2))
        return tuple(out)
