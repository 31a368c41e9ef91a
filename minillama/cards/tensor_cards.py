"""The cards of single tensors: queries, keys, values, the cache rows read, scores, probabilities,
merged heads, the residual stream and the feed-forward hidden (chapters 4, 5 and 6).

Each builder takes the call's `Ctx` and returns what goes on the card: the tensor, a subtitle, where it
lives, a "Size" figure and the pinned sources; `catalogue.py` finds it by name. Not here: the cards of
whole components (`components.py`, `attention_cards.py`).
"""

from __future__ import annotations

from .card import Figure
from .context import Ctx, heads, sources, x_tensor
from .tensors import BYTES_16, SYMBOLS, Axis, NamedTensor, commas, format_bytes, pos_axis, rows_text


def _attention_where(c: Ctx, name: str) -> str:
    return f"each of {c.args.n_layers} transformer blocks › attention · {name}"


def _size(elements: int, per_layer: bool = True, rows=(), text=()) -> list[Figure]:
    """The "Size" figure every tensor card shows: elements per sequence and their 16-bit bytes."""
    figures = [(f"Elements per sequence{' per layer' if per_layer else ''}", commas(elements))]
    figures.append(("At 16-bit", format_bytes(elements * BYTES_16)))
    return [Figure("Size", tuple(figures) + tuple(rows), tuple(text))]


def _projection(
    c: Ctx, name: str, sym: str, n: int, word: str, traced: str, subtitle: str, source: str
) -> dict:
    a = c.args
    elements = c.t * n * a.head_dim
    return {
        "tensor": heads(c, sym, n, word, pos_axis(c.t), traced),
        "subtitle": subtitle,
        "where": _attention_where(c, name),
        "numbers": _size(elements),
        "sources": sources(a, "attn-reshape", "qkv", source, "config"),
        "facts": {"elements": elements},
    }


def xq(c: Ctx) -> dict:
    a = c.args
    subtitle = (
        f"Query vectors, one per query head; heads grouped as ({a.n_kv_heads} kv × {a.n_rep} g), "
        f"query head i reads KV head i // {a.n_rep}."
    )
    return _projection(c, "xq", "Q", a.n_heads, "heads", "q", subtitle, "rope")


def xk(c: Ctx) -> dict:
    subtitle = "Key feature vectors organised into the smaller KV-head collection, rotated by RoPE."
    return _projection(c, "xk", "K", c.args.n_kv_heads, "kv heads", "k_new", subtitle, "rope")


def xv(c: Ctx) -> dict:
    subtitle = "Value vectors organised into the KV heads; not rotated."
    return _projection(c, "xv", "V", c.args.n_kv_heads, "kv heads", "v_new", subtitle, "gqa")


def _cache(c: Ctx, name: str, sym: str, traced: str, what: str) -> dict:
    a = c.args
    elements = c.keys * a.n_kv_heads * a.head_dim
    numbers = _size(elements)
    if c.mode == "full":
        subtitle = f"No cache in full-sequence mode: the {what} read are this call's own."
    else:
        # what tells prefill from decode: how many positions this call writes, which rows, how many it reads
        written = rows_text(c.keys - c.t, c.keys - 1)
        by = "this call's 1 new position" if c.t == 1 else f"this call's {commas(c.t)} new positions"
        subtitle = (
            f"The {what} attention reads this call: {rows_text(0, c.keys - 1)} of the layer's cache; "
            f"{written} written by {by}."
        )
        call = (
            ("New positions (queries)", commas(c.t)),
            ("Cache rows written", written),
            ("Keys read, L", commas(c.keys)),
        )
        allocated = a.max_seq_len * a.n_kv_heads * a.head_dim * BYTES_16
        allocated_row = (f"Allocated for {commas(a.max_seq_len)} positions · 16-bit", format_bytes(allocated))
        numbers = [Figure("This call", call)] + _size(elements, rows=(allocated_row,))
    return {
        "tensor": heads(c, sym, a.n_kv_heads, "kv heads", pos_axis(c.keys), traced),
        "subtitle": subtitle,
        "where": _attention_where(c, name),
        "numbers": numbers,
        "sources": sources(a, "kv-cache", "gqa", "hf-attention"),
        "facts": {"elements": elements},
    }


def cache_k(c: Ctx) -> dict:
    return _cache(c, "cache_k", "K", "k_read", "keys")


def cache_v(c: Ctx) -> dict:
    return _cache(c, "cache_v", "V", "v_read", "values")


_BLOCKWISE = (
    "minillama calls F.scaled_dot_product_attention, which may compute these blockwise without storing "
    "them; the shape is that of the reference's scores tensor."
)


def _scores(c: Ctx, name: str, sym: str, note: str, subtitle: str) -> dict:
    a = c.args
    elements = a.n_heads * c.t * c.keys
    axes = (c.B, Axis(a.n_heads, "heads"), pos_axis(c.t), pos_axis(c.keys, "key", "keys"))
    return {
        "tensor": NamedTensor(SYMBOLS[sym], axes, note, name),
        "subtitle": subtitle,
        "where": _attention_where(c, name),
        "numbers": _size(elements, text=(_BLOCKWISE,)),
        "sources": sources(a, "scores", "gqa"),
        "facts": {"elements": elements},
    }


def scores(c: Ctx) -> dict:
    subtitle = "One score per query head, new position and key read."
    return _scores(c, "scores", "S", "q·k / sqrt(hd) plus the causal mask", subtitle)


def probs(c: Ctx) -> dict:
    subtitle = "Attention weights: each row sums to 1 over the keys a position may read."
    return _scores(c, "probs", "A", "softmax over keys, in float32", subtitle)


def attn_out(c: Ctx) -> dict:
    a = c.args
    elements = c.t * a.n_heads * a.head_dim
    width = Axis(a.n_heads * a.head_dim, f"({a.n_heads} heads × {a.head_dim} hd)")
    return {
        "tensor": NamedTensor(
            SYMBOLS["O"], (c.B, pos_axis(c.t), width), "heads merged, before wo", "layers.0.attention.wo:in"
        ),
        "subtitle": "The weighted values of every head, merged back to one vector per position.",
        "where": f"each of {a.n_layers} transformer blocks › attention · input of wo",
        "numbers": _size(elements),
        "sources": sources(a, "retrieval"),
        "facts": {"elements": elements},
    }


def residual(c: Ctx) -> dict:
    a = c.args
    elements = c.t * a.dim
    return {
        "tensor": x_tensor(c, "x", "layers.0:out"),
        "subtitle": "The stream every block reads from and adds its attention and feed-forward updates to.",
        "where": f"between the blocks, {a.n_layers + 1} times · layers[i] input and output",
        "numbers": _size(elements, per_layer=False),
        "sources": sources(a, "handoff", "config"),
        "facts": {"elements": elements},
    }


def ffn_hidden(c: Ctx) -> dict:
    a = c.args
    elements = c.t * a.ffn_hidden_dim
    tensor = NamedTensor(
        SYMBOLS["u"],
        (c.B, pos_axis(c.t), Axis(a.ffn_hidden_dim, "d_ff")),
        "silu(w1 x) · w3 x",
        "layers.0.feed_forward.w2:in",
    )
    return {
        "tensor": tensor,
        "subtitle": "The gated hidden activations of the feed-forward, the widest tensor of a block.",
        "where": f"each of {a.n_layers} transformer blocks › feed-forward · input of w2",
        "numbers": _size(elements),
        "sources": sources(a, "swiglu", "config"),
        "facts": {"elements": elements},
    }
