"""Hugging Face <-> Meta: parameter names and the q/k row permutation (chapters 3 and 6).

Meta's names are this package's (`layers.0.attention.wq.weight`); Hugging Face's differ
(`model.layers.0.self_attn.q_proj.weight`), and HF stores wq, wk permuted: HF rotates channel p with
channel p + hd/2 instead of Meta's interleaved pair (2p, 2p+1), so its converter reorders each head's
rows (huggingface/transformers v4.46.3, `src/transformers/models/llama/convert_llama_weights_to_hf.py`
221-223, `permute`; `minillama.sources` key "hf-permute"). `load` applies the inverse, so one attention
code path serves both layouts. Not here: finding files (`layout.py`), configs (`configs.py`).
"""

from __future__ import annotations

import re

import torch
from einops import rearrange

# Hugging Face parameter names -> Meta's (a block's parameters, then the rest)
_HF_BLOCK = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
_HF_TOP = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}
_META_BLOCK = {meta: hf for hf, meta in _HF_BLOCK.items()}
_META_TOP = {meta: hf for hf, meta in _HF_TOP.items()}
_HF_BLOCK_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|scales|zeros)")
# a quantised checkpoint (chapter 9, written by `save`) also holds scales and zeros beside the codes
QUANTISED_PARTS = ("weight", "scales", "zeros")
# derived tensors some checkpoints carry; the model recomputes them
IGNORED = re.compile(r"(^|\.)(rotary_emb\.inv_freq|rope\.freqs)$")


def hf_to_meta(name: str) -> str | None:
    """Meta's name for a Hugging Face parameter name, or None when it is not a Llama weight."""
    if match := _HF_BLOCK_RE.fullmatch(name):
        layer, part, kind = match.groups()
        return f"layers.{layer}.{_HF_BLOCK[part]}.{kind}" if part in _HF_BLOCK else None
    base, _, kind = name.rpartition(".")
    return f"{_HF_TOP[base]}.{kind}" if base in _HF_TOP and kind in QUANTISED_PARTS else None


def meta_to_hf(name: str) -> str:
    """Hugging Face's name for a Meta parameter name."""
    if match := re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|scales|zeros)", name):
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_META_BLOCK[part]}.{kind}"
    base, _, kind = name.rpartition(".")
    return f"{_META_TOP[base]}.{kind}"


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved rotary rows -> Hugging Face's half-split rows, per head: row (2p + i) of a head
    moves to row (i · hd/2 + p). The same reordering as transformers' `permute` (see the module docstring)."""
    return rearrange(w, "(h p two) ... -> (h two p) ...", h=n_heads, two=2).contiguous()


def hf_unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `hf_permute`: Hugging Face's q_proj/k_proj rows back to Meta's interleaved pairs."""
    return rearrange(w, "(h two p) ... -> (h p two) ...", h=n_heads, two=2).contiguous()
