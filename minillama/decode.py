"""The two model calls of decoding (chapter 7): `prefill` runs the prompts once and fills the cache,
`decode_one_token` feeds one token per row per step.

They are separate functions, as in pytorch-labs/gpt-fast, so the small, shape-static decode step is
what chapter 8 compiles: its position is a tensor, so `torch.compile(decode_one_token, fullgraph=True)`
never recompiles as positions advance. `generate`, `speculative` and `serving` build on them; this
module imports only the model and `sampling`.
"""

from __future__ import annotations

import torch

from .model import Transformer
from .sampling import sample


def prefill(
    model: Transformer, tokens: torch.Tensor, lengths: torch.Tensor, **sampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run right-padded prompts `[b, t]` (row r holds `lengths[r]` real tokens) through the model from
    position 0, filling the cache; returns the first new tokens `[b, 1]` and their logits `[b, v]`."""
    logits = model(tokens, start_pos=0, logits_at=lengths - 1)[:, 0]
    return sample(logits, **sampling)[:, None], logits


def decode_one_token(
    model: Transformer, token: torch.Tensor, pos: torch.Tensor, **sampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: `token` `[b, 1]` at positions `pos` `[b]` (a tensor, so a compiled step does
    not specialise on it) -> the next tokens `[b, 1]` and their logits `[b, v]`."""
    logits = model(token, start_pos=pos)[:, 0]
    return sample(logits, **sampling)[:, None], logits
