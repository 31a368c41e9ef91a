"""Which cards exist: one table from a card's name to its kind, its title and the function that builds it.

Adding a card is adding one builder (a function of the call's `Ctx` returning the card's fields, in
`components.py`, `attention_cards.py` or `tensor_cards.py`) and one row here. `COMPONENTS` and
`TENSORS` (name -> title) are read off this table. Not here: assembling, checking and rendering a card
(`build.py`, `trace.py`, `render.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from . import attention_cards, components, tensor_cards
from .context import Ctx


class Entry(NamedTuple):
    kind: str  # "component" or "tensor"
    title: str
    build: Callable[[Ctx], dict]
    kv: bool = True  # False: works on each position alone; its card prints no KV-cache lines


CARDS: dict[str, Entry] = {
    # components, in the order data flows through the model
    "embedding": Entry("component", "Token embedding", components.embedding, kv=False),
    "attention_norm": Entry("component", "Attention RMSNorm", components.attention_norm, kv=False),
    "ffn_norm": Entry("component", "Feed-forward RMSNorm", components.ffn_norm, kv=False),
    "norm": Entry("component", "Final RMSNorm", components.norm, kv=False),
    "rope": Entry("component", "Rotary embedding", components.rope, kv=False),
    "attention": Entry("component", "Grouped-query attention", attention_cards.attention),
    "kv_cache": Entry("component", "KV cache", attention_cards.kv_cache),
    "feed_forward": Entry("component", "SwiGLU feed-forward", components.feed_forward, kv=False),
    "block": Entry("component", "Transformer block", components.block),
    "output": Entry("component", "Output head", components.output, kv=False),
    "model": Entry("component", "Whole model", components.model),
    # tensors
    "xq": Entry("tensor", "Query heads", tensor_cards.xq),
    "xk": Entry("tensor", "Key heads", tensor_cards.xk),
    "xv": Entry("tensor", "Value heads", tensor_cards.xv),
    "cache_k": Entry("tensor", "Cached keys", tensor_cards.cache_k),
    "cache_v": Entry("tensor", "Cached values", tensor_cards.cache_v),
    "scores": Entry("tensor", "Attention scores", tensor_cards.scores),
    "probs": Entry("tensor", "Attention probabilities", tensor_cards.probs),
    "attn_out": Entry("tensor", "Merged head outputs", tensor_cards.attn_out),
    "residual": Entry("tensor", "Residual stream", tensor_cards.residual, kv=False),
    "ffn_hidden": Entry("tensor", "Feed-forward hidden", tensor_cards.ffn_hidden, kv=False),
}
COMPONENTS = {name: e.title for name, e in CARDS.items() if e.kind == "component"}
TENSORS = {name: e.title for name, e in CARDS.items() if e.kind == "tensor"}
