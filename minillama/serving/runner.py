"""Turning a scheduled batch into tensors and running the model on the paged cache (chapter 12).

The model runs unchanged: the runner installs one `PagedKVCache` per layer as the attention's cache
for the duration of a step (and puts back whatever cache was there, so `ml.generate` still works on
the same model between steps), builds a `PagedView` for the rows of the step, and calls
`model(tokens, paged=view)`. Rows with one new token (decoding sequences) run together as one
`[b, 1]` forward; each prefill chunk runs as its own `[1, t]` forward. Padding a chunk of 200 tokens
and 20 decode rows into one `[21, 200]` batch would compute twenty times the work; a varlen kernel (as
vLLM and nano-vllm use, flash-attn's `flash_attn_varlen_func`) packs them into one row instead.
The equivalent nano-vllm room: GeeeekExplorer/nano-vllm `nanovllm/engine/model_runner.py`
(`prepare_prefill`, `prepare_decode`: slot mappings and block tables from the sequences).
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

    def view(self, rows: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, PagedView]:
        """Tokens `[b, t]` and the view for rows of (sequence, new tokens), right-padded to the longest."""
        bs, t = self.block_size, max(n for _, n in rows)
        width = max(len(seq.table) for seq, _ in rows)
        tokens = torch.zeros(len(rows), t, dtype=torch.long)
        positions = torch.zeros(len(rows), t, dtype=torch.long)
        slots = torch.full((len(rows), t), -1, dtype=torch.long)
        tables = torch.zeros(len(rows), width, dtype=torch.long)
        for r, (seq, n) in enumerate(rows):
            pos = torch.arange(seq.computed, seq.computed + n)
            table = torch.tensor(seq.table)
            tokens[r, :n] = torch.tensor(seq.tokens[seq.computed : seq.computed + n])
            positions[r, :n] = pos
            slots[r, :n] = table[pos // bs] * bs + pos % bs
            tables[r, : len(table)] = table
        to = {"device": self.device}
        return tokens.to(**to), PagedView(positions.to(**to), slots.to(**to), tables.to(**to), bs)

    @torch.inference_mode()
    def run(self, batch: list[tuple[Sequence, int]]) -> list[torch.Tensor]:
        """The float32 logits `[v]` after each row's last new token, in the batch's order."""
        logits: list[torch.Tensor | None] = [None] * len(batch)
        ones = [i for i, (_, n) in enumerate(batch) if n == 1]
        groups = ([ones] if ones else []) + [[i] for i, (_, n) in enumerate(batch) if n > 1]
        with self.installed():
            for group in groups:
                rows = [batch[i] for i in group]
                tokens, view = self.view(rows)
                out = self.model(tokens, logits_at=-1, paged=view)[:, 0]
                for i, row_logits in zip(group, out, strict=True):
                    logits[i] = row_logits
        return logits
