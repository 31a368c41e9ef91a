"""Exact parameter, memory and FLOP accounting from a config alone (chapter 1).

Every weight matrix of Llama 3.1 follows from `ModelArgs`: an embedding and an untied output head of
v × d, and per block four attention projections, three SwiGLU matrices and two RMSNorm gains, plus
a final norm. `tests/test_accounting.py` checks the totals against the modules and the published
8,030,261,248 / 70,553,706,496 / 405,853,388,800.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelArgs


def _n(x: int) -> str:
    return f"{x:,}"


@dataclass(frozen=True)
class ParameterCount:
    args: ModelArgs
    embedding: int  # tok_embeddings: v × d
    attention: int  # per block: wq, wk, wv, wo
    feed_forward: int  # per block: w1, w2, w3
    norms: int  # per block: attention_norm and ffn_norm gains
    final_norm: int
    output: int  # untied head: v × d (0 when tied to the embedding: counted once, there)

    @property
    def per_block(self) -> int:
        return self.attention + self.feed_forward + self.norms

    @property
    def blocks(self) -> int:
        return self.args.n_layers * self.per_block

    @property
    def total(self) -> int:
        return self.embedding + self.blocks + self.final_norm + self.output

    def table(self) -> list[tuple[str, str, int]]:
        """Rows (component, calculation, parameters) in the order a forward pass meets them."""
        a, L = self.args, self.args.n_layers
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        f = a.ffn_hidden_dim
        return [
            ("Token embedding", f"{_n(a.vocab_size)} × {_n(a.dim)}", self.embedding),
            ("Query projection wq", f"{_n(a.dim)} × {_n(q)} × {L}", L * a.dim * q),
            ("Key projection wk", f"{_n(a.dim)} × ({a.n_kv_heads} × {a.head_dim}) × {L}", L * a.dim * kv),
            ("Value projection wv", f"{_n(a.dim)} × ({a.n_kv_heads} × {a.head_dim}) × {L}", L * a.dim * kv),
            ("Output projection wo", f"{_n(q)} × {_n(a.dim)} × {L}", L * q * a.dim),
            ("Gate w1 and up w3", f"2 × {_n(a.dim)} × {_n(f)} × {L}", L * 2 * a.dim * f),
            ("Down w2", f"{_n(f)} × {_n(a.dim)} × {L}", L * f * a.dim),
            ("RMSNorm gains", f"2 × {_n(a.dim)} × {L} + {_n(a.dim)}", L * self.norms + self.final_norm),
            (
                "Output head",
                "tied: the embedding" if a.tie_embeddings else f"{_n(a.dim)} × {_n(a.vocab_size)}",
                self.output,
            ),
            ("Total", "", self.total),
        ]


def count_parameters(args: ModelArgs) -> ParameterCount:
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    return ParameterCount(
        args=args,
        embedding=args.vocab_size * args.dim,
        attention=args.dim * q + 2 * args.dim * kv + q * args.dim,
        feed_forward=3 * args.dim * args.ffn_hidden_dim,
        norms=2 * args.dim,
        final_norm=args.dim,
        output=0 if args.tie_embeddings else args.dim * args.vocab_size,
    )


def kv_cache_bytes(args: ModelArgs, positions: int, batch: int = 1, bytes_per_value: float = 2) -> int:
    """K and V for every layer, KV head and position: 2 · n_layers · kv · hd · positions · batch · bytes."""
    return int(2 * args.n_layers * args.n_kv_heads * args.head_dim * positions * batch * bytes_per_value)


FORMATS = (None, "int8", "int4")  # None: every weight at its 16-bit (or given) width


def _linears(args: ModelArgs) -> list[tuple[int, int, int]]:
    """(out, in, how many) of every matrix a forward multiplies by: the blocks' seven, then the head."""
    q, kv, f, d, L = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim, args.ffn_hidden_dim, args.dim, args.n_layers
    return [(q, d, L), (kv, d, 2 * L), (d, q, L), (f, d, 2 * L), (d, f, L), (args.vocab_size, d, 1)]


def linear_bytes(out: int, inputs: int, format: str | None = None, group_size: int = 128, bytes_16: float = 2) -> int:
    """Bytes of one `[out, inputs]` weight matrix: `bytes_16` per weight unquantised; int8: 1 per weight and a
    16-bit scale per output channel; int4: half a byte per weight and a 16-bit scale and zero per group."""
    if format is None:
        return int(out * inputs * bytes_16)
    if format == "int8":
        return out * inputs + int(out * bytes_16)
    if format == "int4":
        if inputs % group_size:
            raise ValueError(f"group_size={group_size} does not divide {inputs} inputs; pick one that does")
        return out * inputs // 2 + int(2 * out * (inputs // group_size) * bytes_16)
    raise ValueError(f"unknown format {format!r}; use one of {FORMATS}")


def weight_bytes(
    args: ModelArgs, bytes_per_param: float = 2, format: str | None = None, group_size: int = 128, head: bool = True
) -> int:
    """All weights at a storage width: 2 for bf16, 1 for fp8, 0.5 for int4 (scales not counted). With a
    `format` ("int8", "int4"), the linear layers of the blocks (and the head, unless `head=False`) are
    counted in it, scales and zeros included (`linear_bytes`), the rest at `bytes_per_param`."""
    if format is None:
        return int(count_parameters(args).total * bytes_per_param)
    c = count_parameters(args)
    *blocks, (v, d, _) = _linears(args)
    quantised = sum(n * linear_bytes(o, i, format, group_size, bytes_per_param) for o, i, n in blocks)
    rest = c.total - sum(n * o * i for o, i, n in blocks)
    if head:
        quantised += linear_bytes(v, d, format, group_size, bytes_per_param)
        # untied: the head leaves the 16-bit rest; tied, quantising the head adds a quantised copy of the
        # embedding (which stays 16-bit for the lookup)
        rest -= 0 if args.tie_embeddings else v * d
    return quantised + int(rest * bytes_per_param)


def decode_step_bytes(
    args: ModelArgs,
    context: int,
    batch: int = 1,
    bytes_per_value: float = 2,
    format: str | None = None,
    group_size: int = 128,
    head: bool = True,
) -> int:
    """Bytes one decode step must read: every weight once (the embedding only for the batch's rows,
    unless it is also the output head, which reads all of it) and the KV cache of `context` positions
    per sequence. The floor of a memory-bound step. With a `format` the weights are counted as
    `weight_bytes` counts them; the cache stays at `bytes_per_value`."""
    c = count_parameters(args)
    weights = weight_bytes(args, bytes_per_value, format, group_size, head)
    if not (args.tie_embeddings and (format is None or not head)):  # the embedding is not also the head read
        weights -= int((c.embedding - batch * args.dim) * bytes_per_value)  # the rows a step does not read
    return weights + kv_cache_bytes(args, context, batch, bytes_per_value)


def flops_per_token(args: ModelArgs, context: int) -> int:
    """Forward FLOPs for one new position attending to `context` keys: 2 per weight of every matrix
    product (embedding lookup excluded) plus the score and value products, 2 · 2 · h · hd · context
    per layer."""
    c = count_parameters(args)
    matmul = (
        args.n_layers * (c.attention + c.feed_forward) + args.dim * args.vocab_size
    )  # the head, tied or not
    attention = args.n_layers * 2 * 2 * args.n_heads * args.head_dim * context
    return 2 * matmul + attention


@dataclass(frozen=True)
class RankBytes:
    """What one of `degree` tensor-parallel ranks holds (chapter 11)."""

    weights: int  # its slices of every matrix + the replicated norm gains
    kv_cache: int  # its n_kv_heads / degree heads of every layer's cache

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


def tensor_parallel_bytes(
    args: ModelArgs, degree: int, positions: int = 0, batch: int = 1, bytes_per_value: float = 2
) -> RankBytes:
    """Memory per rank when `degree` ranks split `args` Megatron-style (`minillama.distributed`): every
    matrix (embedding and head along the vocabulary) is cut `degree` ways, the norm gains are
    replicated, and each rank caches only its n_kv_heads / degree KV heads, `positions` per sequence."""
    if degree < 1 or args.n_kv_heads % degree:
        raise ValueError(f"degree {degree} must divide n_kv_heads={args.n_kv_heads}")
    c = count_parameters(args)
    replicated = args.n_layers * c.norms + c.final_norm
    sharded = c.total - replicated  # each matrix splits evenly for the Llama 3.1 sizes at degrees 1, 2, 4, 8
    weights = int((-(-sharded // degree) + replicated) * bytes_per_value)
    return RankBytes(weights, kv_cache_bytes(args, positions, batch, bytes_per_value) // degree)


def tensor_parallel_traffic(args: ModelArgs, degree: int, batch: int = 1, bytes_per_value: float = 2) -> int:
    """Bytes each rank sends per decode step (one new position per sequence) under `degree`-way tensor
    parallelism with ring collectives: two all-reduces of `[b, 1, d]` per block and one after the
    embedding, each sending 2(N - 1)/N of the tensor, and the all-gather of the `[b, 1, v]` logits,
    (N - 1)/N of it."""
    n = degree
    activations = batch * args.dim * bytes_per_value
    all_reduces = (2 * args.n_layers + 1) * 2 * (n - 1) / n * activations
    return int(all_reduces + (n - 1) / n * batch * args.vocab_size * bytes_per_value)
