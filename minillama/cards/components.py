"""The cards of the model's pieces outside attention: embedding, norms, rotary tables, feed-forward,
block, output head and the whole model (chapters 1, 2, 3 and 6).

Each builder takes the call's `Ctx` and returns what goes on the card (the fields of `Card` below its
title and mode lines); `catalogue.py` finds it by name. Attention and its cache have their own file
(`attention_cards.py`); tensors theirs (`tensor_cards.py`).
"""

from __future__ import annotations

import math

from ..accounting import decode_step_bytes, flops_per_token, kv_cache_bytes, linear_bytes, weight_bytes
from ..config import ModelArgs
from ..rope import inv_freq
from .card import Figure, Parameters
from .context import Ctx, numel, params, rope_tensor, sources, x_tensor
from .tensors import BYTES_16, BYTES_32, SYMBOLS, Axis, NamedTensor, commas, format_bytes, pos_axis
from .trace import meta_model


def embedding(c: Ctx) -> dict:
    a, count = c.args, c.count
    tokens = NamedTensor(SYMBOLS["tokens"], (c.B, pos_axis(c.t)), "int64 ids", "tokens")
    rows = (("Token embedding", f"{commas(a.vocab_size)} × {commas(a.dim)}", count.embedding),)
    emb = meta_model(a).tok_embeddings
    head = (
        "The output head is this same matrix (tied): it is stored and counted once, here."
        if a.tie_embeddings
        else f"The output head is a separate (untied) {commas(a.dim)} × {commas(a.vocab_size)} matrix."
    )
    lookup = f"A lookup reads one row per position: {format_bytes(a.dim * BYTES_16)} at 16-bit. {head}"
    return {
        "subtitle": "Looks up one learned d-wide row per token id.",
        "where": "before the blocks · tok_embeddings",
        "inputs": [tokens],
        "outputs": [x_tensor(c, traced="tok_embeddings:out")],
        "parameters": params(rows, count.embedding, 1, numel(emb), a, word=""),
        "numbers": [
            Figure(
                "Weights",
                ((f"{commas(a.vocab_size)} rows · 16-bit", format_bytes(count.embedding * BYTES_16)),),
                (lookup,),
            )
        ],
        "sources": sources(a, "transformer", "config"),
    }


def _norm(c: Ctx, module, key: str, symbols: tuple[str, str], where: str, instances: int, accounted: int):
    a = c.args
    sym_in, sym_out = symbols
    return {
        "subtitle": "x / sqrt(mean(x²) + eps) · gain, the statistic in float32, the result in the input dtype.",
        "where": where,
        "inputs": [x_tensor(c, sym_in, f"{key}:in")],
        "outputs": [x_tensor(c, sym_out, f"{key}:out")],
        "parameters": params(
            (("Gain", f"{commas(a.dim)}", module.weight.numel()),), accounted, instances, numel(module), a
        ),
        "numbers": [Figure("Normalisation", text=(f"eps = {a.norm_eps:g}; no bias, no mean subtraction.",))],
        "sources": sources(a, "rmsnorm", "handoff" if key != "norm" else "transformer"),
    }


def attention_norm(c: Ctx) -> dict:
    where = f"{c.blocks_where} › before attention · layers[i].attention_norm"
    module, per_block = c.block.attention_norm, c.count.norms // 2
    return _norm(c, module, "layers.0.attention_norm", ("x", "x_hat"), where, c.args.n_layers, per_block)


def ffn_norm(c: Ctx) -> dict:
    where = f"{c.blocks_where} › before the feed-forward · layers[i].ffn_norm"
    module, per_block = c.block.ffn_norm, c.count.norms // 2
    return _norm(c, module, "layers.0.ffn_norm", ("h", "h_hat"), where, c.args.n_layers, per_block)


def norm(c: Ctx) -> dict:
    model = meta_model(c.args)
    return _norm(c, model.norm, "norm", ("h", "h_hat"), "after the last block · norm", 1, c.count.final_norm)


def _rope_bands(a: ModelArgs) -> str:
    """How many rotary pairs Llama 3.1's scaling keeps, divides and blends (from the module's frequencies)."""
    base = inv_freq(a.replace(use_scaled_rope=False))
    wavelen = 2 * math.pi / base
    short = a.rope_original_max_seq_len / a.rope_high_freq_factor
    long = a.rope_original_max_seq_len / a.rope_low_freq_factor
    kept = int((wavelen < short).sum())
    divided = int((wavelen > long).sum())
    blended = len(base) - kept - divided
    if not a.use_scaled_rope:
        return f"Unscaled: all {len(base)} pairs keep theta = {a.rope_theta:,.0f} frequencies."
    return (
        f"Of {len(base)} pairs, {kept} with wavelengths under {commas(int(short))} positions are kept; {divided} "
        f"with wavelengths over {commas(int(long))} have their frequencies divided by {a.rope_scale_factor:g} "
        f"(wavelengths {a.rope_scale_factor:g}× longer); {blended} between are blended smoothly."
    )


def rope(c: Ctx) -> dict:
    a = c.args
    p = a.head_dim // 2
    table = a.max_seq_len * p * 2 * BYTES_32
    meta_table = 2 * a.max_seq_len * p * 2 * BYTES_32  # precompute_freqs_cis(hd, 2 · max_seq_len): complex64
    text = (
        f"ω_p = {a.rope_theta:,.0f}^(−2p / {a.head_dim}) before Llama 3.1 scaling. " + _rope_bands(a),
        "Hugging Face pairs channel i with i + hd/2 instead and permutes wq, wk to match.",
    )
    return {
        "subtitle": "Rotates each (2p, 2p+1) channel pair of every query and key head by position · ω_p.",
        "where": f"{c.blocks_where} › attention, on q and k · tables in model.rope",
        "inputs": [NamedTensor(SYMBOLS["positions"], (pos_axis(c.t),), "the positions of this call")],
        "outputs": [rope_tensor(c)],
        "parameters_line": "none (tables derived from the config, not learned)",
        "numbers": [
            Figure(
                "Tables",
                (
                    (
                        f"minillama's cos, sin · {commas(a.max_seq_len)} positions × {p} pairs · float32",
                        format_bytes(table),
                    ),
                    (
                        f"Meta's complex64 table · 2 × {commas(a.max_seq_len)} positions × {p} pairs",
                        format_bytes(meta_table),
                    ),
                ),
                text,
            )
        ],
        "sources": sources(
            a, "rope", "rope-scaling", "rope-table", "hf-rope", "hf-rope-scaling", "hf-permute"
        ),
    }


def _ffn_width_text(a: ModelArgs) -> str:
    if a.hidden_dim is not None:
        return f"Width set explicitly: hidden_dim = {commas(a.hidden_dim)}."
    base = int(2 * (4 * a.dim) / 3)
    steps = [f"int(2 × 4 × {commas(a.dim)} / 3) = {commas(base)}"]
    if a.ffn_dim_multiplier is not None:
        base = int(a.ffn_dim_multiplier * base)
        steps.append(f"× {a.ffn_dim_multiplier} → {commas(base)}")
    steps.append(f"rounded up to a multiple of {commas(a.multiple_of)} → {commas(a.ffn_hidden_dim)}")
    return "Width: " + "; ".join(steps) + "."


def _ffn_params(c: Ctx) -> Parameters:
    a, ffn = c.args, c.block.feed_forward
    f = a.ffn_hidden_dim
    rows = (
        ("Gate projection w1", f"{commas(a.dim)} × {commas(f)}", ffn.w1.weight.numel()),
        ("Up projection w3", f"{commas(a.dim)} × {commas(f)}", ffn.w3.weight.numel()),
        ("Down projection w2", f"{commas(f)} × {commas(a.dim)}", ffn.w2.weight.numel()),
    )
    return params(rows, c.count.feed_forward, a.n_layers, numel(ffn), a)


def feed_forward(c: Ctx) -> dict:
    a, count = c.args, c.count
    rows = (
        ("Hidden width d_ff", commas(a.ffn_hidden_dim)),
        ("Weights per block · 16-bit", format_bytes(count.feed_forward * BYTES_16)),
        ("FLOPs per position", commas(2 * count.feed_forward)),
    )
    return {
        "subtitle": "w2(silu(w1 x) · w3 x): a gated expansion to the hidden width and back.",
        "where": f"{c.blocks_where} › feed-forward · layers[i].feed_forward",
        "inputs": [x_tensor(c, "h_hat", "layers.0.feed_forward:in")],
        "outputs": [x_tensor(c, "d_ffn", "layers.0.feed_forward:out")],
        "parameters": _ffn_params(c),
        "numbers": [Figure("Width and cost", rows, (_ffn_width_text(a),))],
        "sources": sources(a, "swiglu", "config", "handoff"),
    }


def block(c: Ctx) -> dict:
    a, count, blk = c.args, c.count, c.block
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    rows = (
        ("Attention RMSNorm gain", f"{commas(a.dim)}", blk.attention_norm.weight.numel()),
        (
            "Attention wq, wk, wv, wo",
            f"2 × {commas(a.dim)} × {commas(q)} + 2 × {commas(a.dim)} × {commas(kv)}",
            numel(blk.attention),
        ),
        ("Feed-forward RMSNorm gain", f"{commas(a.dim)}", blk.ffn_norm.weight.numel()),
        (
            "Feed-forward w1, w3, w2",
            f"3 × {commas(a.dim)} × {commas(a.ffn_hidden_dim)}",
            numel(blk.feed_forward),
        ),
    )
    figures = (
        ("Weights · 16-bit", format_bytes(count.per_block * BYTES_16)),
        ("Attention share", f"{count.attention / count.per_block:.1%}"),
        ("Feed-forward share", f"{count.feed_forward / count.per_block:.1%}"),
        ("KV cache per token · 16-bit", format_bytes(kv_cache_bytes(a.replace(n_layers=1), 1))),
    )
    if c.format:  # the seven matrices in the format, the two norm gains still 16-bit
        q, kv, f = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.ffn_hidden_dim
        shapes = [(q, a.dim), (kv, a.dim), (kv, a.dim), (a.dim, q), (f, a.dim), (f, a.dim), (a.dim, f)]
        quantised = sum(linear_bytes(o, i, c.format, c.group_size) for o, i in shapes) + count.norms * BYTES_16
        figures = (figures[0], (f"Weights · {c.format_label}", format_bytes(quantised)), *figures[1:])
    return {
        "subtitle": "h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).",
        "where": f"{c.blocks_where} · layers[i]",
        "inputs": [x_tensor(c, "x", "layers.0:in"), rope_tensor(c)],
        "outputs": [x_tensor(c, "x_out", "layers.0:out")],
        "parameters": params(rows, count.per_block, a.n_layers, numel(blk), a),
        "numbers": [Figure("Per block", figures)],
        "sources": sources(a, "handoff", "qkv", "swiglu", "rmsnorm", "config"),
    }


def output(c: Ctx) -> dict:
    a, count = c.args, c.count
    vocab = Axis(a.vocab_size, "vocab")
    logits = NamedTensor(
        SYMBOLS["logits"], (c.B, pos_axis(c.t), vocab), "float32 after the model's cast", "output:out"
    )
    head = meta_model(a).output
    tied = a.tie_embeddings
    calc = f"tied: the embedding's {commas(a.vocab_size)} × {commas(a.dim)}" if tied else None
    rows = (("Output head", calc or f"{commas(a.dim)} × {commas(a.vocab_size)}", count.output),)
    shared = a.dim * a.vocab_size * BYTES_16
    figures = (
        (
            "Weights · 16-bit",
            f"{format_bytes(shared)} shared with the embedding"
            if tied
            else format_bytes(count.output * BYTES_16),
        ),
        ("Logits per position · float32", format_bytes(a.vocab_size * BYTES_32)),
    )
    return {
        "subtitle": "Projects the final normalised stream to one score per vocabulary entry, in float32.",
        "where": "after the final norm · output",
        "inputs": [x_tensor(c, "h_hat", "output:in")],
        "outputs": [logits],
        "parameters": params(rows, count.output, 1, 0 if tied else numel(head), a, word=""),
        "numbers": [
            Figure(
                "Weights and logits",
                figures,
                (
                    "Tied: the token embedding's matrix, read in full at every step (its parameters are counted in the embedding)."
                    if tied
                    else "Untied: a separate matrix from the token embedding.",
                ),
            )
        ],
        "sources": sources(a, "transformer", "logits", "config"),
    }


def _decode_floor_text(c: Ctx, floor: int) -> str:
    """What the decode floor counts: every weight but the embedding table (a token reads one row of it)."""
    a, count = c.args, c.count
    kv = kv_cache_bytes(a, c.keys)
    if a.tie_embeddings:
        weights = count.total * BYTES_16
        if weights + kv != floor:
            raise RuntimeError(f"decode floor {floor:,} B != {weights:,} + {kv:,} B")
        return (
            "A decode step's floor reads every weight once, the embedding table in full: it is also the "
            f"output head (tied). {format_bytes(weights)} of weights + {format_bytes(kv)} of KV cache "
            f"= {format_bytes(floor)}."
        )
    matrices = (count.total - count.embedding) * BYTES_16
    row = a.dim * BYTES_16
    if matrices + row + kv != floor:  # accounting.decode_step_bytes and this sentence must agree
        raise RuntimeError(f"decode floor {floor:,} B != {matrices:,} + {row:,} + {kv:,} B")
    return (
        "A decode step's floor reads every weight once except the embedding table "
        f"({format_bytes(count.embedding * BYTES_16)}), of which a sequence reads only its token's row: "
        f"{format_bytes(matrices)} of other weights + {format_bytes(row)} + {format_bytes(kv)} of KV cache "
        f"= {format_bytes(floor)}."
    )


def model(c: Ctx) -> dict:
    a, count = c.args, c.count
    rows = tuple((c_, calc, n) for c_, calc, n in count.table() if c_ != "Total")
    net = meta_model(a)
    module_total = numel(net) + (a.n_layers - 1) * numel(net.layers[0])
    flops = flops_per_token(a, c.keys)
    step = [
        ("Weights · 16-bit", format_bytes(weight_bytes(a, BYTES_16))),
        *(
            [(f"Weights · {c.format_label}", format_bytes(weight_bytes(a, BYTES_16, c.format, c.group_size)))]
            if c.format
            else []
        ),
    ]
    sequence = [
        ("KV cache after this call · 16-bit", format_bytes(kv_cache_bytes(a, c.keys))),
        ("FLOPs per new position", commas(flops)),
    ]
    numbers = [
        Figure(
            "Per model · held once, shared by every sequence in a batch",
            tuple(step),
            ("A decode step reads every weight but the embedding table once, whatever the batch.",),
        ),
        Figure(
            "Per sequence · each sequence in a batch adds these",
            tuple(sequence),
            (
                "FLOPs count 2 per weight of every matrix product plus the score and value products "
                f"over {commas(c.keys)} keys.",
            ),
        ),
    ]
    facts = {}
    if c.mode == "decode":
        floor = decode_step_bytes(a, c.keys)
        decode = [
            ("Bytes it reads at least · 16-bit", format_bytes(floor)),
        ]
        facts["decode_step_bytes"] = floor
        if c.format:
            quantised = decode_step_bytes(a, c.keys, format=c.format, group_size=c.group_size)
            decode.append((f"Bytes it reads at least · {c.format_label}", format_bytes(quantised)))
            facts["decode_step_bytes_quantised"] = quantised
        decode.append(("FLOPs per byte read · 16-bit", f"{flops / floor:.2f}"))
        text = (
            _decode_floor_text(c, floor),
            "A batch shares the weights' bytes but not the FLOPs or the cache: batching raises the FLOPs "
            "per byte.",
        )
        numbers.append(Figure("A decode step of one sequence · weights + its cache", tuple(decode), text))
    logits = NamedTensor(
        SYMBOLS["logits"], (c.B, pos_axis(c.t), Axis(a.vocab_size, "vocab")), "float32", ":out"
    )
    return {
        "subtitle": f"{a.n_layers} blocks between an embedding and "
        + ("an output head tied to it." if a.tie_embeddings else "an untied output head."),
        "where": "tokens → logits · Transformer",
        "inputs": [NamedTensor(SYMBOLS["tokens"], (c.B, pos_axis(c.t)), "int64 ids", "tokens")],
        "outputs": [logits],
        "parameters": params(rows, count.total, 1, module_total, a, word=""),
        "numbers": numbers,
        "sources": sources(a, "config", "context", "transformer", "logits", "handoff"),
        "facts": facts,
    }
