"""The cards of grouped-query attention and its KV cache (chapters 4 and 5).

Each builder takes the call's `Ctx` and returns what goes on the card (the fields of `Card` below its
title and mode lines); `catalogue.py` finds it by name. Here too: the KV-cache figure and facts both
cards show (bytes per token against multi-head attention, after this call, at the full context). Not
here: the other components (`components.py`), the tensor cards (`tensor_cards.py`).
"""

from __future__ import annotations

from ..accounting import kv_cache_bytes
from ..config import ModelArgs
from .card import Figure, Parameters
from .context import Ctx, heads, numel, params, rope_tensor, sources, x_tensor
from .tensors import BYTES_16, Axis, commas, format_bytes, pos_axis


def _grouping_text(a: ModelArgs) -> str:
    if a.n_rep == 1:
        return f"No grouping: every one of the {a.n_heads} query heads has its own K/V head (MHA)."
    return (
        f"Grouping cuts W_K, W_V and the cache {a.n_rep}×; the score and value products still run over "
        f"{a.n_heads} heads."
    )


def kv_figure(c: Ctx) -> Figure:
    a = c.args
    mha = a.replace(n_kv_heads=a.n_heads)
    per_token, mha_per_token = kv_cache_bytes(a, 1), kv_cache_bytes(mha, 1)
    full, mha_full = kv_cache_bytes(a, a.max_seq_len), kv_cache_bytes(mha, a.max_seq_len)
    kv_word = "head" if a.n_kv_heads == 1 else "heads"
    text = [f"2 (K, V) × {a.n_layers} layers × {a.n_kv_heads} {kv_word} × {a.head_dim} × {BYTES_16} bytes."]
    after = kv_cache_bytes(a, c.keys)
    if c.mode == "full":
        text.append(
            f"This call keeps no cache; one for its {commas(c.keys)} positions would hold {format_bytes(after)} "
            f"per sequence."
        )
    else:
        batch = (
            f" ({format_bytes(after * c.batch)} for {c.batch} sequences)" if isinstance(c.batch, int) else ""
        )
        text.append(
            f"After this call, at {commas(c.keys)} positions: {format_bytes(after)} in use per sequence{batch}."
        )
    text.append(
        f"At the full {commas(a.max_seq_len)} tokens: {format_bytes(full)} per sequence "
        f"(MHA: {format_bytes(mha_full)})."
    )
    return Figure(
        "KV cache per token · all layers",
        (
            (f"{a.name} · 16-bit", format_bytes(per_token)),
            (f"MHA ({a.n_heads} K/V heads) · 16-bit", format_bytes(mha_per_token)),
        ),
        (" ".join(text), _grouping_text(a)),
    )


def kv_facts(c: Ctx) -> dict:
    a = c.args
    mha = a.replace(n_kv_heads=a.n_heads)
    return {
        "kv_bytes_per_token": kv_cache_bytes(a, 1),
        "mha_kv_bytes_per_token": kv_cache_bytes(mha, 1),
        "kv_bytes_after_call": kv_cache_bytes(a, c.keys),
        "kv_bytes_full_context": kv_cache_bytes(a, a.max_seq_len),
        "mha_kv_bytes_full_context": kv_cache_bytes(mha, a.max_seq_len),
    }


def _attention_params(c: Ctx) -> Parameters:
    a, att = c.args, c.block.attention
    kv = f"{commas(a.dim)} × ({a.n_kv_heads} × {a.head_dim})"
    rows = (
        ("Query projection", f"{commas(a.dim)} × {commas(a.n_heads * a.head_dim)}", att.wq.weight.numel()),
        ("Key projection", kv, att.wk.weight.numel()),
        ("Value projection", kv, att.wv.weight.numel()),
        ("Output projection", f"{commas(a.n_heads * a.head_dim)} × {commas(a.dim)}", att.wo.weight.numel()),
    )
    return params(rows, c.count.attention, a.n_layers, numel(att), a)


def attention(c: Ctx) -> dict:
    a = c.args
    return {
        "subtitle": f"{a.n_heads} query heads read {a.n_kv_heads} key/value heads, {a.n_rep} query heads per KV head.",
        "where": f"{c.blocks_where} › attention · layers[i].attention",
        "inputs": [x_tensor(c, "x", "layers.0.attention:in"), rope_tensor(c)],
        "outputs": [x_tensor(c, "d_attn", "layers.0.attention:out")],
        "parameters": _attention_params(c),
        "numbers": [kv_figure(c)],
        "sources": sources(
            a,
            "config",
            "qkv",
            "rope",
            "gqa",
            "scores",
            "retrieval",
            "handoff",
            "kv-cache",
            "generation-dtype",
        ),
        "facts": kv_facts(c),
    }


def kv_cache(c: Ctx) -> dict:
    a = c.args
    t_new = pos_axis(c.t)
    read = pos_axis(c.keys)
    kw = {
        "subtitle": "Keys and values of every position attended to, preallocated and written by row.",
        "where": f"{c.blocks_where} › attention · layers[i].attention.cache",
        "inputs": [
            heads(c, "k", a.n_kv_heads, "kv heads", t_new, "k_new"),
            heads(c, "v", a.n_kv_heads, "kv heads", t_new, "v_new"),
        ],
        "outputs": [
            heads(c, "K", a.n_kv_heads, "kv heads", read, "k_read"),
            heads(c, "V", a.n_kv_heads, "kv heads", read, "v_read"),
        ],
        "parameters_line": "none (state of a generation, not weights; kept out of the state dict)",
        "numbers": [kv_figure(c)],
        "sources": sources(a, "kv-cache", "gqa", "generation-dtype", "hf-attention", "config"),
        "facts": kv_facts(c),
    }
    if c.mode != "full":
        buffer = Axis(c.batch, "batch"), Axis(a.n_kv_heads, "kv heads"), pos_axis(a.max_seq_len)
        kw["notes"] = [
            (
                f"Buffers per layer: K, V [{', '.join(str(x) for x in buffer)}, {a.head_dim} hd], "
                f"allocated for max_seq_len = {commas(a.max_seq_len)} (minillama's layout is head-first; "
                f"Meta's is [batch, positions, kv heads, hd])."
            )
        ]
    return kw
