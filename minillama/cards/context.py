"""What every card builder starts from: the call (model, mode, sizes) and the pieces cards share (all chapters).

Here: the three modes and the `Ctx` of one call (P or T positions, L keys read, the batch symbol),
the check of a call's arguments, the mode and KV-cache lines, the pinned sources of a card, the
tensors many cards show (the residual-width `x`, the rotary table, a head tensor) and `params`, which
makes a parameter table agree with the module and with `accounting.py`. Not here: the cards of the
components and tensors themselves (`components.py`, `attention_cards.py`, `tensor_cards.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..accounting import ParameterCount, count_parameters
from ..config import MODELS, ModelArgs
from ..sources import SOURCES, Source
from .card import Parameters
from .tensors import SYMBOLS, Axis, NamedTensor, commas, pos_axis, rows_text
from .trace import meta_model

MODES = ("full", "prefill", "decode")
MODE_TITLES = {"full": "Full sequence", "prefill": "Prefill", "decode": "Decode"}
_CATALOGUE = {
    "llama-3.1-8b": "config",
    "llama-3.1-70b": "config-70b",
    "llama-3.1-405b": "config-405b",
    "llama-3.2-1b": "config-3.2-1b",
    "llama-3.2-3b": "config-3.2-3b",
    "llama-3.3-70b": "config-3.3-70b",
}


@dataclass(frozen=True)
class Ctx:
    args: ModelArgs
    mode: str
    positions: int  # P in decode, T otherwise
    batch: int | str
    t: int  # new positions this call
    keys: int  # L, keys read
    format: str | None = None  # weights quantised to "int8" or "int4" (chapter 9); None: 16-bit
    group_size: int = 128  # int4's group of inputs per scale and zero

    @property
    def format_label(self) -> str:
        """How a figure names the format: "int8 (+ a scale per row)", "int4 g128 (+ scales, zeros)"."""
        if self.format == "int8":
            return "int8 (+ a scale per row)"
        return f"int4 g{self.group_size} (+ a scale and zero per group)"

    @property
    def B(self) -> Axis:
        return Axis(self.batch, "batch")

    @property
    def count(self) -> ParameterCount:
        return count_parameters(self.args)

    @property
    def block(self):
        """The first block of the meta-device model (every block is alike)."""
        return meta_model(self.args).layers[0]

    @property
    def blocks_where(self) -> str:
        return f"each of {self.args.n_layers} transformer blocks"


def validate(name: str, valid: dict, what: str, args, mode: str, positions, batch) -> None:
    """Raise on a name outside `valid` (named as a `what`) or arguments no card can show."""
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(valid)}")
    if not isinstance(args, ModelArgs):
        raise TypeError(
            f"args must be a ModelArgs (e.g. minillama.MODELS['llama-3.1-8b']); got {type(args).__name__}"
        )
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if isinstance(positions, bool) or not isinstance(positions, int):
        raise TypeError(f"positions must be an int; got {positions!r}")
    if mode == "decode" and not 0 <= positions < args.max_seq_len:
        raise ValueError(
            f"decode with P={positions} cached positions needs P + 1 <= max_seq_len={args.max_seq_len}; "
            f"use positions in 0..{args.max_seq_len - 1}"
        )
    if mode != "decode" and not 1 <= positions <= args.max_seq_len:
        raise ValueError(
            f"{mode} of T={positions} positions needs 1 <= T <= max_seq_len={args.max_seq_len}; "
            f"use positions in 1..{args.max_seq_len}"
        )
    if isinstance(batch, bool) or not (
        isinstance(batch, str) and batch or isinstance(batch, int) and batch >= 1
    ):
        raise ValueError(f"batch must be a symbol such as 'B' or a positive int; got {batch!r}")


def make_ctx(args, mode, positions, batch, format=None, group_size=128) -> Ctx:
    t = 1 if mode == "decode" else positions
    keys = positions + 1 if mode == "decode" else positions
    if format is not None:
        from ..accounting import weight_bytes

        weight_bytes(args, 2, format, group_size)  # an unknown format or a group that does not fit raises here
    return Ctx(args, mode, positions, batch, t, keys, format, group_size)


def mode_lines(c: Ctx, kv: bool = True) -> tuple[str, str]:
    """The mode and state lines; `kv` False for what works on each position alone (no keys read)."""
    P, T, L = c.positions, c.t, c.keys
    if not kv:
        return (
            {
                "decode": f"decode · 1 new position, at position P = {commas(P)}",
                "prefill": f"prefill · T = {commas(T)} new positions, at positions 0–{commas(T - 1)}",
                "full": f"full sequence · T = {commas(T)} positions",
            }[c.mode],
            "no KV cache here: each position is computed on its own; only attention writes and reads the cache",
        )
    if c.mode == "decode":
        return (
            f"decode · P = {commas(P)} cached positions · L = P + 1 = {commas(L)} keys read",
            f"KV cache: writes {rows_text(P, P)}, reads rows 0–{commas(P)}",
        )
    if c.mode == "prefill":
        return (
            f"prefill · T = {commas(T)} new positions into an empty cache · L = T = {commas(L)} keys read",
            f"KV cache: writes {rows_text(0, T - 1)}, reads {rows_text(0, T - 1)}",
        )
    return (
        f"full sequence · T = {commas(T)} positions · no cache · L = T = {commas(L)} keys read",
        "no KV cache: keys and values of this call's positions are used once and not kept",
    )


# sources


def _config_source(args: ModelArgs) -> list[Source]:
    for key, source_key in _CATALOGUE.items():
        if args == MODELS[key]:
            return [SOURCES[source_key]]
    return []


# every card's byte figures are binary (format_bytes); chapters that work in GB (1e9) convert with this line
UNITS_NOTE = "Bytes in binary units: 1 GiB = 2³⁰ bytes ≈ 1.074 GB (10⁹ bytes)."


def _config_note(args: ModelArgs) -> str:
    if _config_source(args) and args.tie_embeddings:
        return (
            "Dimensions from Meta's pinned catalogue; the tied head and RoPE factor 32 from the published "
            "Hugging Face config.json (tie_word_embeddings, rope_scaling.factor), which the catalogue omits. "
            + UNITS_NOTE
        )
    if _config_source(args):
        return (
            "Dimensions from Meta's pinned catalogue; every count and size here is computed from them "
            "(no checkpoint is loaded). " + UNITS_NOTE
        )
    return "A configuration outside Meta's catalogue: every figure follows from the config given. " + UNITS_NOTE


def sources(args: ModelArgs, *keys: str) -> list[Source]:
    """The pinned sources of `keys`; "config" stands for the catalogue entry of `args`, if it has one."""
    out = []
    for key in keys:
        if key == "transformer" and args.tie_embeddings:
            continue  # Meta's llama3 Transformer has an untied head: not a source for a tied model
        out += _config_source(args) if key == "config" else [SOURCES[key]]
    return out


# tensors many cards show


def x_tensor(c: Ctx, sym="x", traced="") -> NamedTensor:
    return NamedTensor(SYMBOLS[sym], (c.B, pos_axis(c.t), Axis(c.args.dim, "d")), traced=traced)


def rope_tensor(c: Ctx, traced="rope") -> NamedTensor:
    p = c.args.head_dim // 2
    return NamedTensor(
        SYMBOLS["R"], (pos_axis(c.t), Axis(p, "pair" if p == 1 else "pairs")), "cos, sin; float32", traced
    )


def heads(c: Ctx, sym: str, n: int, word: str, t_axis: Axis, traced: str, note="") -> NamedTensor:
    return NamedTensor(SYMBOLS[sym], (c.B, Axis(n, word), t_axis, Axis(c.args.head_dim, "hd")), note, traced)


# parameters


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def params(rows, accounted: int, instances: int, module_count: int, args, word="blocks") -> Parameters:
    # the module's own parameters, the rows, and accounting.py must tell the same story
    if not sum(r[2] for r in rows) == module_count == accounted:
        raise RuntimeError(
            f"parameter rows sum to {sum(r[2] for r in rows):,}, the module holds {module_count:,}, "
            f"accounting.py says {accounted:,}"
        )
    return Parameters(tuple(rows), accounted, instances, word, _config_note(args))
