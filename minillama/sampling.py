"""Sampling the next token from logits (chapter 7): argmax, a tempered, top-k / top-p restricted
softmax, and a draw from it without a host sync.

x_{n+1} ~ softmax(logits / temperature), restricted to the top-k tokens and/or the smallest set whose
probability reaches top_p (Holtzman et al. 2019, "nucleus sampling"), or argmax when temperature is 0.
These are the primitives that `generate`, `speculative` and `serving` share; this module imports
none of them.
"""

from __future__ import annotations

import torch


def argmax(x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """`x.argmax(dim=-1)` for `[b, v]` (the same index, the first of tied maxima), in two passes when v
    splits into chunks: the largest value of each chunk, the best chunk, then the best entry within it.
    A CPU's argmax over one long row runs as a scalar loop (~0.23 ms for 128,256 logits here), while
    amax vectorises (~0.01 ms); the two passes take ~0.03 ms, ~2.5 % of a tiny-model decode step."""
    b, v = x.shape
    if v % chunk or v < 16 * chunk:
        return x.argmax(dim=-1)
    chunks = x.view(b, v // chunk, chunk)
    best = chunks.amax(dim=-1).argmax(dim=-1, keepdim=True)  # [b, 1]: the first chunk holding the max
    within = chunks.gather(1, best[:, :, None].expand(b, 1, chunk))[:, 0].argmax(dim=-1)
    return best[:, 0] * chunk + within


def probabilities(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0
) -> torch.Tensor:
    """The distribution `sample` draws from when temperature > 0: softmax(logits / temperature) over
    `[..., v]`, restricted to the top_k largest logits and to the top_p nucleus (zeros elsewhere; the
    restricted rows are not renormalised, a draw by `draw` does not need it)."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        # Meta's rule (llama3 `llama/generation.py` sample_top_p): keep the most probable tokens until
        # the mass before a token reaches top_p; the most probable token always stays
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs


def draw(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of `[b, v]` non-negative weights, index i with probability w_i / sum(w), without
    a host sync: argmax of weights / Exp(1) noise (the exponential race, as gpt-fast samples); tokens of
    weight 0 can never win (the noise is clamped away from 0, where 0 / 0 would be NaN and argmax would
    pick a masked token)."""
    noise = (
        torch.empty_like(weights)
        .exponential_(1, generator=generator)
        .clamp_min_(torch.finfo(weights.dtype).tiny)
    )
    return argmax(weights / noise)


def sample(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next tokens `[b]` from logits `[b, v]`: argmax when temperature is 0, else a draw from the
    tempered softmax restricted to the top_k largest logits and to the top_p nucleus."""
    if temperature == 0:
        return argmax(logits)
    return draw(probabilities(logits, temperature, top_k, top_p), generator)
