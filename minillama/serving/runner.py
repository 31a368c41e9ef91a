"""Turning a scheduled batch into tensors and running the model on the paged cache (chapter 12).

The model runs unchanged: the runner installs one `PagedKVCache` per layer as the attention's cache
for the duration of a step (and puts back whatever cache was there, so `ml.generate` still works on
the same model between steps), builds a `PagedView` for the rows of the step, and calls
`model(tokens, paged=view)`. All the step's work is packed into one row: the new tokens of every
scheduled sequence one after another (`[1, T]`, T = the step's tokens), the block tables one after
another, and a mask that lets each token see the keys of its own sequence up to its own position. So
one forward per step reads the weights once for decode tokens and prefill chunks alike, with no
padding, and the head runs only at the last token of each sequence. Padding a chunk of 200 tokens and
20 decode rows into one `[21, 200]` batch would compute twenty times the work; running them as
separate forwards would read the weights once per group. vLLM and nano-vllm pack the same way and
call flash-attn's varlen kernel; here the mask does the separating.
The equivalent nano-vllm room: GeeeekExplorer/nano-vllm @ bb823b3 `nanovllm/engine/model_runner.py`
(`prepare_prefill` 129–170, `prepare_decode` 172–188: positions, slot mappings and block tables from
the sequences).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..model import Transformer
from .paged_cache import PagedKVCache, PagedView
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int):
        self.model, self.block_size = model, block_size
        w = model.tok_embeddings.weight  # the cache holds activations: the embedding's dtype and device
        self.device = w.device
        self.caches = [
            PagedKVCache(
                num_blocks, block_size, layer.attention.local_kv_heads, model.args.head_dim, w.device, w.dtype
            )
            for layer in model.layers
        ]

    @property
    def bytes_per_block(self) -> int:
        return sum(c.k[0].nbytes + c.v[0].nbytes for c in self.caches)

    @contextmanager
    def installed(self):
        saved = [layer.attention.cache for layer in self.model.layers]
        for layer, cache in zip(self.model.layers, self.caches, strict=True):
            layer.attention.cache = cache
        try:
            yield
        finally:
            for layer, cache in zip(self.model.layers, saved, strict=True):
                layer.attention.cache = cache

    def view(self, batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, PagedView, torch.Tensor]:
        """The step packed into one row: tokens `[1, T]`, its view, and the index of each sequence's last
        new token `[1, len(batch)]` (where its logits are read)."""
        bs = self.block_size
        tokens, positions, slots, tables, q_seq, k_seq, k_pos = [], [], [], [], [], [], []
        for r, (seq, n) in enumerate(batch):
            pos = range(seq.computed, seq.computed + n)
            tokens += seq.tokens[seq.computed : seq.computed + n]
            positions += pos
            slots += [seq.table[p // bs] * bs + p % bs for p in pos]
            tables += seq.table
            q_seq += [r] * n
            k_seq += [r] * (len(seq.table) * bs)
            k_pos += range(len(seq.table) * bs)
        to = {"device": self.device}
        positions, q_seq, k_seq, k_pos = (torch.tensor(x, **to) for x in (positions, q_seq, k_seq, k_pos))
        # a token sees the keys of its own sequence at positions up to its own
        mask = (q_seq[:, None] == k_seq) & (k_pos <= positions[:, None])
        last = torch.tensor([n for _, n in batch], **to).cumsum(0) - 1
        view = PagedView(
            positions[None], torch.tensor([slots], **to), torch.tensor([tables], **to), bs, mask[None]
        )
        return torch.tensor([tokens], **to), view, last[None]

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> torch.Tensor:
        """The float32 logits after each sequence's last new token, `[len(batch), v]`, in the batch's order."""
        tokens, view, last = self.view(batch)
        with self.installed():
            return self.model(tokens, logits_at=last, paged=view)[0]
