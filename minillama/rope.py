"""Rotary position embedding with Llama 3.1 frequency scaling (chapter 3).

RoPE (Su et al. 2021) rotates each pair p of a query or key head by the angle position · ω_p, with
ω_p = theta^(-2p / hd), so a query–key score depends only on their distance. Pairs are Meta's
interleaved channels (2p, 2p+1) (meta-llama/llama3 `llama/model.py` 65–75); Hugging Face pairs
channel p with p + hd/2 instead and permutes wq/wk to match (chapter 3; `checkpoint/names.py`).

Llama 3.1 scaling (meta-llama/llama-models `models/llama3/model.py` 45–62): wavelengths 2π/ω above
original/low_freq_factor (8,192) are divided by `rope_scale_factor` (8), those below
original/high_freq_factor (2,048) are kept, and the band between blends the two smoothly.
"""

import math

import torch
from einops import rearrange
from torch import nn

from .config import ModelArgs


def inv_freq(args: ModelArgs, device=None) -> torch.Tensor:
    """ω_p for p = 0 .. hd/2 - 1, scaled as Llama 3.1 does when `use_scaled_rope`: `[p]`, float32."""
    hd = args.head_dim
    freqs = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, device=device).float() / hd))
    if not args.use_scaled_rope:
        return freqs
    low, high = args.rope_low_freq_factor, args.rope_high_freq_factor
    original = args.rope_original_max_seq_len
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > original / low, freqs / args.rope_scale_factor, freqs)
    smooth = (original / wavelen - low) / (high - low)  # 0 at the long end of the band, 1 at the short end
    blended = (1 - smooth) * scaled / args.rope_scale_factor + smooth * scaled
    in_band = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(in_band, blended, scaled)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of `x` `[..., t, (p two)]` by angles with cos/sin broadcastable to
    `[..., t, p]`. Computed in float32 (as the reference does), returned in x's dtype."""
    pairs = rearrange(x.float(), "... (p two) -> ... p two", two=2)
    x0, x1 = pairs.unbind(-1)
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rearrange(rotated, "... p two -> ... (p two)").type_as(x)


class RotaryEmbedding(nn.Module):
    """cos and sin of position · ω_p for every position up to `max_seq_len`: `[s, p]` tables,
    computed once. They are derived state (not in the state dict) and always float32."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self._build(device=None)

    def _build(self, device) -> None:
        angles = torch.outer(
            torch.arange(self.args.max_seq_len, device=device).float(), inv_freq(self.args, device)
        )
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _apply(self, fn, recurse=True):
        # the tables are derived float32 state, never converted: model.to(torch.bfloat16) would round
        # them (bf16 angles are off by whole radians at position 100,000), and a model built on the meta
        # device has nothing to copy. They are rebuilt, in float32, wherever the module now lives.
        try:
            device = fn(torch.empty(0, device=self.cos.device)).device
        except NotImplementedError:  # "cannot copy out of meta tensor": moving a meta-built model
            device = fn(torch.empty(0)).device
        self._build(device)
        return self

    def forward(self, positions: torch.Tensor):
        """`positions` `[b, t]` -> cos, sin `[b, t, p]`."""
        return self.cos[positions], self.sin[positions]
