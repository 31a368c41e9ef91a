"""The cards: every component and tensor of Llama 3.1, computed from a config and a mode (all chapters).

A card shows what a piece of the model takes and gives (tensors with named axes and sizes), its
learned parameters (per instance and across the blocks), what the KV cache does in the chosen mode,
a few figures "in numbers", and the pinned sources each claim rests on (`minillama.sources`).
Nothing on a card is typed in: counts come from `accounting.py` and the modules, sizes from the
config, and every shape is checked against the real module run on the `meta` device (no memory, no
compute) with forward hooks, so a card cannot disagree with the code.

Modes:
- "full": T positions, no cache (training, or scoring a whole text);
- "prefill": T positions written to cache rows 0 .. T-1 (the prompt);
- "decode": 1 new position after P cached ones; it writes row P and reads L = P + 1 rows.

    ml.card("attention", ml.MODELS["llama-3.1-8b"], mode="decode", positions=1000)
    ml.tensor_card("xk", args, mode="prefill", positions=512)
    ml.card_tabs("attention", args, positions=1000)   # the three modes as tabs (static HTML)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import html
import itertools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .accounting import count_parameters, decode_step_bytes, flops_per_token, kv_cache_bytes, weight_bytes
from .config import MODELS, ModelArgs
from .model import Transformer
from .rope import inv_freq
from .sources import SOURCES, Source

MODES = ("full", "prefill", "decode")
MODE_TITLES = {"full": "Full sequence", "prefill": "Prefill", "decode": "Decode"}
COMPONENTS = {
    "embedding": "Token embedding",
    "attention_norm": "Attention RMSNorm",
    "ffn_norm": "Feed-forward RMSNorm",
    "norm": "Final RMSNorm",
    "rope": "Rotary embedding",
    "attention": "Grouped-query attention",
    "kv_cache": "KV cache",
    "feed_forward": "SwiGLU feed-forward",
    "block": "Transformer block",
    "output": "Output head",
    "model": "Whole model",
}
TENSORS = {
    "xq": "Query heads",
    "xk": "Key heads",
    "xv": "Value heads",
    "cache_k": "Cached keys",
    "cache_v": "Cached values",
    "scores": "Attention scores",
    "probs": "Attention probabilities",
    "attn_out": "Merged head outputs",
    "residual": "Residual stream",
    "ffn_hidden": "Feed-forward hidden",
}
BYTES_16 = 2  # bf16 / fp16, the width Meta's generation runs at (sources: generation-dtype)
BYTES_32 = 4
_STAND_IN = 2  # the concrete batch a symbolic "B" is traced with (2, so it cannot pass for a broadcast 1)
_CATALOGUE = {"llama-3.1-8b": "config", "llama-3.1-70b": "config-70b", "llama-3.1-405b": "config-405b"}


# numbers as the cards print them


def _n(x: int) -> str:
    return f"{x:,}"


def format_bytes(n: float) -> str:
    """Binary units, one decimal where not integral: 131072 -> "128 KiB", 131203072 -> "125.1 MiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value):,} {units[unit]}" if value == int(value) else f"{value:,.1f} {units[unit]}"


def _rows(a: int, b: int) -> str:
    return f"row {_n(a)}" if a == b else f"rows {_n(a)}–{_n(b)}"


# named tensors


@dataclass(frozen=True)
class Symbol:
    text: str
    tex: str
    html: str


def _sym(text: str, tex: str | None = None, html_: str | None = None) -> Symbol:
    return Symbol(text, tex or text, html_ or f"<i>{html.escape(text)}</i>")


SYMBOLS = {
    "tokens": Symbol("tokens", r"\mathrm{tokens}", "tokens"),
    "positions": Symbol("positions", r"\mathrm{positions}", "positions"),
    "x": _sym("x"),
    "x_hat": Symbol("x̂", r"\hat{x}", "<i>x̂</i>"),
    "h": _sym("h"),
    "h_hat": Symbol("ĥ", r"\hat{h}", "<i>ĥ</i>"),
    "x_out": Symbol("x′", r"x'", "<i>x</i>′"),
    "R": _sym("R"),
    "d_attn": Symbol("Δ_attn", r"\Delta_{\mathrm{attn}}", "Δ<sub>attn</sub>"),
    "d_ffn": Symbol("Δ_ffn", r"\Delta_{\mathrm{ffn}}", "Δ<sub>ffn</sub>"),
    "logits": Symbol("logits", r"\mathrm{logits}", "logits"),
    "Q": _sym("Q"),
    "K": _sym("K"),
    "V": _sym("V"),
    "k": _sym("k"),
    "v": _sym("v"),
    "S": _sym("S"),
    "A": _sym("A"),
    "O": _sym("O"),
    "u": _sym("u"),
}


@dataclass(frozen=True)
class Axis:
    size: int | str  # an int, or a symbol such as "B"
    name: str  # as printed after the size, singular or plural to match it
    positions: bool = False  # position counts always get thousands separators

    def __str__(self) -> str:
        if isinstance(self.size, str):
            return f"{self.size} {self.name}"
        # model widths print as the seed does ("4096 d"); from five digits, and for positions, grouped
        size = _n(self.size) if self.positions or self.size >= 10_000 else str(self.size)
        return f"{size} {self.name}"


def _pos(n: int, singular="position", plural="positions") -> Axis:
    return Axis(n, singular if n == 1 else plural, positions=True)


@dataclass(frozen=True)
class NamedTensor:
    symbol: Symbol
    axes: tuple[Axis, ...]
    note: str = ""  # dtype or layout remark
    traced: str = ""  # the key of the recorded shape this tensor is checked against

    def shape(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if isinstance(a.size, str) else a.size for a in self.axes)

    def text(self) -> str:
        axes = ", ".join(str(a) for a in self.axes)
        return f"{self.symbol.text} [{axes}]" + (f" ({self.note})" if self.note else "")

    def markdown(self) -> str:
        axes = ", ".join(str(a) for a in self.axes)
        return f"${self.symbol.tex}$ [{axes}]" + (f" ({self.note})" if self.note else "")

    def html(self) -> str:
        axes = ", ".join(html.escape(str(a)) for a in self.axes)
        note = f" <span class='ml-dim'>({html.escape(self.note)})</span>" if self.note else ""
        return f"<span class='ml-tensor'>{self.symbol.html} [{axes}]</span>{note}"


# the card


@dataclass(frozen=True)
class Parameters:
    rows: tuple[tuple[str, str, int], ...]  # component, calculation, parameters
    per_instance: int
    instances: int  # 1, or n_layers for what every block has
    instance_word: str = "blocks"
    note: str = ""

    @property
    def total(self) -> int:
        return self.per_instance * self.instances

    def line(self) -> str:
        if self.instances == 1:
            return _n(self.per_instance)
        return f"{_n(self.per_instance)} · × {self.instances} {self.instance_word} = {_n(self.total)}"

    def across(self) -> str:
        if self.instances == 1:
            return f"One instance: {_n(self.total)} parameters."
        return (
            f"Across {self.instances} independent {self.instance_word}: {_n(self.per_instance)} × "
            f"{self.instances} = {_n(self.total)} parameters."
        )


@dataclass(frozen=True)
class Figure:
    heading: str
    rows: tuple[tuple[str, str], ...] = ()
    text: tuple[str, ...] = ()


@dataclass
class Card:
    name: str
    kind: str  # "component" or "tensor"
    title: str
    subtitle: str
    where: str
    mode: str
    mode_line: str
    state_line: str
    inputs: list[NamedTensor] = field(default_factory=list)
    outputs: list[NamedTensor] = field(default_factory=list)
    tensor: NamedTensor | None = None
    parameters: Parameters | None = None
    parameters_line: str = ""
    numbers: list[Figure] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: str = ""
    facts: dict = field(default_factory=dict)  # the raw numbers behind the card, for tests and notebooks

    # plain text, for a terminal

    def __str__(self) -> str:
        out = [self.title, self.subtitle, f"where: {self.where}", ""]
        if self.tensor is not None:
            out.append(f"tensor: {self.tensor.text()}")
        if self.inputs:
            out.append("in:  " + "   ".join(t.text() for t in self.inputs))
        if self.outputs:
            out.append("out: " + "   ".join(t.text() for t in self.outputs))
        if self.parameters_line:
            out.append(f"parameters: {self.parameters_line}")
        out += [f"mode: {self.mode_line}", f"state: {self.state_line}"]
        if self.parameters is not None:
            p = self.parameters
            out += [
                "",
                "Parameters",
                f"{_n(p.per_instance)} parameters per instance, across its learned components",
            ]
            rows = [("Component", "Calculation", "Parameters")]
            rows += [(c, calc, _n(n)) for c, calc, n in p.rows]
            rows.append(("Per-instance total", "", _n(p.per_instance)))
            widths = [max(len(r[i]) for r in rows) for i in range(3)]
            for r in rows:
                out.append(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}")
            out.append(p.across())
            if p.note:
                out.append(p.note)
        if self.numbers:
            out += ["", "In numbers"]
            for fig in self.numbers:
                out.append(fig.heading)
                width = max((len(label) for label, _ in fig.rows), default=0)
                out += [f"  {label:<{width}}  {value}" for label, value in fig.rows]
                out += list(fig.text)
        if self.notes:
            out += [""] + self.notes
        out += ["", f"Sources ({len(self.sources)})"]
        for s in self.sources:
            out.append(f"  {s.label} · {s.evidence} · {s.claim}")
            out.append(f"    {s.repo} @ {s.short_revision}: {s.url}")
        out += ["", self.checked]
        return "\n".join(out)

    # markdown, for Jupyter and the book

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", f"*{self.subtitle}* · where: {self.where}", ""]
        lines = []
        if self.tensor is not None:
            lines.append(f"tensor: {self.tensor.markdown()}")
        if self.inputs:
            lines.append("in: " + " ".join(t.markdown() for t in self.inputs))
        if self.outputs:
            lines.append("out: " + " ".join(t.markdown() for t in self.outputs))
        if self.parameters_line:
            lines.append(f"parameters: {self.parameters_line}")
        lines += [f"mode: {self.mode_line}", f"state: {self.state_line}"]
        out += [line + "  " for line in lines[:-1]] + lines[-1:]
        if self.parameters is not None:
            p = self.parameters
            out += [
                "",
                "**Parameters**",
                "",
                f"{_n(p.per_instance)} parameters per instance, across its learned components",
                "",
                "| Component | Calculation | Parameters |",
                "|---|---|---:|",
            ]
            out += [f"| {c} | {calc} | {_n(n)} |" for c, calc, n in p.rows]
            out += [f"| **Per-instance total** | | **{_n(p.per_instance)}** |", "", p.across()]
            if p.note:
                out += ["", p.note]
        if self.numbers:
            out += ["", "**In numbers**"]
            for fig in self.numbers:
                out += ["", f"*{fig.heading}*", ""]
                if fig.rows:
                    out += ["| | |", "|---|---:|"] + [f"| {label} | {value} |" for label, value in fig.rows]
                    out.append("")
                out += list(fig.text)
        if self.notes:
            out += [""] + self.notes
        out += ["", f"**Sources** ({len(self.sources)})", ""]
        out += [f"- {s.markdown()}" for s in self.sources]
        out += ["", f"*{self.checked}*"]
        return "\n".join(out)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    # HTML, for JupyterLab and the static site

    def html_body(self) -> str:
        e = html.escape
        out = [
            f"<div class='ml-title'>{e(self.title)}</div>",
            f"<div class='ml-dim'>{e(self.subtitle)} · where: {e(self.where)}</div>",
            "<dl class='ml-facts'>",
        ]
        if self.tensor is not None:
            out.append(f"<dt>tensor</dt><dd>{self.tensor.html()}</dd>")
        if self.inputs:
            out.append(f"<dt>in</dt><dd>{' '.join(t.html() for t in self.inputs)}</dd>")
        if self.outputs:
            out.append(f"<dt>out</dt><dd>{' '.join(t.html() for t in self.outputs)}</dd>")
        if self.parameters_line:
            out.append(f"<dt>parameters</dt><dd>{e(self.parameters_line)}</dd>")
        out.append(
            f"<dt>mode</dt><dd>{e(self.mode_line)}</dd><dt>state</dt><dd>{e(self.state_line)}</dd></dl>"
        )
        if self.parameters is not None:
            p = self.parameters
            out += [
                "<div class='ml-h'>Parameters</div>",
                f"<div>{_n(p.per_instance)} parameters per instance, across its learned components</div>",
                (
                    "<table class='ml-table'><thead><tr><th>Component</th><th>Calculation</th>"
                    "<th class='ml-num'>Parameters</th></tr></thead><tbody>"
                ),
            ]
            out += [
                f"<tr><td>{e(c)}</td><td>{e(calc)}</td><td class='ml-num'>{_n(n)}</td></tr>"
                for c, calc, n in p.rows
            ]
            out.append(
                f"<tr class='ml-total'><td>Per-instance total</td><td></td>"
                f"<td class='ml-num'>{_n(p.per_instance)}</td></tr></tbody></table>"
            )
            out.append(f"<div>{e(p.across())}</div>")
            if p.note:
                out.append(f"<div class='ml-dim'>{e(p.note)}</div>")
        if self.numbers:
            out.append("<div class='ml-h'>In numbers</div>")
            for fig in self.numbers:
                out.append(f"<div class='ml-sub'>{e(fig.heading)}</div>")
                if fig.rows:
                    out.append("<table class='ml-table ml-figures'><tbody>")
                    out += [
                        f"<tr><td>{e(label)}</td><td class='ml-num'><b>{e(value)}</b></td></tr>"
                        for label, value in fig.rows
                    ]
                    out.append("</tbody></table>")
                out += [f"<div>{e(t)}</div>" for t in fig.text]
        out += [f"<div class='ml-dim'>{e(n)}</div>" for n in self.notes]
        out.append(f"<div class='ml-h'>Sources ({len(self.sources)})</div><ul class='ml-sources'>")
        for s in self.sources:
            out.append(
                f"<li><a href='{e(s.url)}'>{e(s.label)}</a> <span class='ml-dim'>· {e(s.evidence)} · "
                f"{e(s.repo)} @ <code>{e(s.short_revision)}</code></span><br>{e(s.claim)}</li>"
            )
        out.append(f"</ul><div class='ml-dim'>{e(self.checked)}</div>")
        return "\n".join(out)

    def html(self) -> str:
        return f"<div class='ml-card'>{_STYLE}\n{self.html_body()}\n</div>"

    def _repr_html_(self) -> str:
        return self.html()


# colours are inherited (currentColor) and borders translucent, so the card reads in light and dark themes
_STYLE = """<style>
.ml-card{border:1px solid rgba(127,127,127,.35);border-radius:6px;padding:.8em 1em;margin:.5em 0;
color:inherit;background:transparent;font-size:.92em;line-height:1.45;max-width:60em}
.ml-card .ml-title{font-weight:600;font-size:1.12em}
.ml-card .ml-dim{opacity:.72}
.ml-card .ml-h{font-weight:600;margin-top:.9em;border-top:1px solid rgba(127,127,127,.25);padding-top:.5em}
.ml-card .ml-sub{font-style:italic;margin-top:.4em}
.ml-card dl.ml-facts{display:grid;grid-template-columns:max-content auto;gap:.1em .8em;margin:.6em 0}
.ml-card dl.ml-facts dt{opacity:.72}
.ml-card dl.ml-facts dd{margin:0}
.ml-card .ml-tensor{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;margin-right:.8em}
.ml-card table.ml-table{border-collapse:collapse;margin:.4em 0;color:inherit;background:transparent}
.ml-card table.ml-table th,.ml-card table.ml-table td{border:0;border-bottom:1px solid rgba(127,127,127,.25);
padding:.2em .8em .2em 0;text-align:left;background:transparent;color:inherit}
.ml-card table.ml-table .ml-num{text-align:right;font-variant-numeric:tabular-nums}
.ml-card table.ml-table tr.ml-total td{font-weight:600;border-bottom:0}
.ml-card ul.ml-sources{margin:.3em 0;padding-left:1.2em}
.ml-card a{color:inherit;text-decoration:underline}
.ml-card code{background:transparent;color:inherit}
</style>"""


# tracing the real modules on the meta device


class _AttentionKernelRecorder(TorchFunctionMode):
    """Records the shapes going into the attention kernel: q `[b, kv, (g t), hd]`, k, v `[b, kv, s, hd]`."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            self.calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=8)
def _meta_model(args: ModelArgs) -> Transformer:
    with torch.device("meta"):
        model = Transformer(args.replace(n_layers=1))  # every block is alike; one is traced
    return model


def _shape(x):
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (tuple, list)) and x and all(isinstance(t, torch.Tensor) for t in x):
        return tuple(tuple(t.shape) for t in x)
    return None


@functools.lru_cache(maxsize=128)
def _trace(args: ModelArgs, mode: str, positions: int, batch: int) -> dict:
    """Run one block of the model on the meta device in `mode` and record the shape of every module's
    first input and output, of the keys/values written into the cache, and of the attention kernel's
    q, k, v. Returns {"<module>:in" / "<module>:out" / "cache_write" / "kernel" / "cache_buffer": shape}."""
    model = _meta_model(args)
    t = 1 if mode == "decode" else positions
    start = {"full": None, "prefill": 0, "decode": positions}[mode]
    shapes: dict = {}
    handles = []
    for name, module in model.named_modules():

        def hook(module, inputs, output, name=name):
            shapes[f"{name}:in"] = _shape(inputs[0]) if inputs else None
            shapes[f"{name}:out"] = _shape(output)

        handles.append(module.register_forward_hook(hook))
    try:
        if start is None:
            model.clear_cache()
        else:
            model.setup_cache(batch, args.max_seq_len)
            cache = model.layers[0].attention.cache
            shapes["cache_buffer"] = tuple(cache.k.shape)
            update = cache.update

            def recording_update(positions_, k, v):
                shapes["cache_write"] = (tuple(k.shape), tuple(v.shape))
                return update(positions_, k, v)

            cache.update = recording_update  # this trace's own cache object
        recorder = _AttentionKernelRecorder()
        tokens = torch.zeros(batch, t, dtype=torch.long, device="meta")
        with torch.no_grad(), recorder:
            model(tokens, start_pos=start)
        (shapes["kernel"],) = recorder.calls
    finally:
        for h in handles:
            h.remove()
        model.clear_cache()
    return shapes


def _traced_shape(key: str, trace: dict, g: int) -> tuple[int, ...]:
    """The shape the code produced for a card tensor, in the book's layout (heads h = kv · g)."""
    q, k, v = trace["kernel"]
    if key == "q":  # b kv (g t) hd -> b (kv g) t hd
        return (q[0], q[1] * g, q[2] // g, q[3])
    if key in ("scores", "probs"):  # q kᵀ: b kv (g t) s -> b (kv g) t s
        return (q[0], q[1] * g, q[2] // g, k[2])
    if key == "k_read":
        return k
    if key == "v_read":
        return v
    if key == "k_new":
        return trace["cache_write"][0] if "cache_write" in trace else k
    if key == "v_new":
        return trace["cache_write"][1] if "cache_write" in trace else v
    if key == "rope":  # cos of [b or 1, t, p]: the table rows of this call's positions
        return trace["rope:out"][0][-2:]
    if key == "tokens":
        return trace[":in"]
    return trace[key]


def _check_shapes(card: Card, args: ModelArgs, batch: int) -> None:
    trace = _trace(args, card.mode, card.facts["positions"], batch)
    tensors = card.inputs + card.outputs + ([card.tensor] if card.tensor else [])
    for t in tensors:
        if not t.traced:
            continue
        recorded = _traced_shape(t.traced, trace, args.n_rep)
        if recorded != t.shape(batch):
            raise RuntimeError(
                f"card {card.name!r} ({card.mode}) says {t.text()} = {t.shape(batch)}, but the module produced "
                f"{recorded} ({t.traced}); the card and minillama disagree"
            )
    if card.mode == "decode" and card.facts["keys_read"] != trace["kernel"][1][2]:
        raise RuntimeError(
            f"card says L = {card.facts['keys_read']} keys read; the kernel read {trace['kernel'][1][2]}"
        )


# building cards


@dataclass(frozen=True)
class _Ctx:
    args: ModelArgs
    mode: str
    positions: int  # P in decode, T otherwise
    batch: int | str
    t: int  # new positions this call
    keys: int  # L, keys read

    @property
    def B(self) -> Axis:
        return Axis(self.batch, "batch")


def _validate(name: str, valid: dict, args, mode: str, positions, batch) -> None:
    if name not in valid:
        raise ValueError(
            f"unknown {'card' if valid is COMPONENTS else 'tensor'} {name!r}; valid: {', '.join(valid)}"
        )
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


def _ctx(args, mode, positions, batch) -> _Ctx:
    t = 1 if mode == "decode" else positions
    keys = positions + 1 if mode == "decode" else positions
    return _Ctx(args, mode, positions, batch, t, keys)


def _mode_lines(c: _Ctx) -> tuple[str, str]:
    P, T, L = c.positions, c.t, c.keys
    if c.mode == "decode":
        return (
            f"decode · P = {_n(P)} cached positions · L = P + 1 = {_n(L)} keys read",
            f"KV cache: writes {_rows(P, P)}, reads rows 0–{_n(P)}",
        )
    if c.mode == "prefill":
        return (
            f"prefill · T = {_n(T)} new positions into an empty cache · L = T = {_n(L)} keys read",
            f"KV cache: writes {_rows(0, T - 1)}, reads {_rows(0, T - 1)}",
        )
    return (
        f"full sequence · T = {_n(T)} positions · no cache · L = T = {_n(L)} keys read",
        "no KV cache: keys and values of this call's positions are used once and not kept",
    )


def _config_source(args: ModelArgs) -> list[Source]:
    for key, source_key in _CATALOGUE.items():
        if args == MODELS[key]:
            return [SOURCES[source_key]]
    return []


def _config_note(args: ModelArgs) -> str:
    if _config_source(args):
        return "Dimensions from Meta's pinned catalogue; checkpoint tensors are not counted here."
    return "A configuration outside Meta's catalogue: every figure follows from the config given."


def _sources(args: ModelArgs, *keys: str) -> list[Source]:
    out = []
    for key in keys:
        out += _config_source(args) if key == "config" else [SOURCES[key]]
    return out


def _x(c: _Ctx, sym="x", traced="") -> NamedTensor:
    return NamedTensor(SYMBOLS[sym], (c.B, _pos(c.t), Axis(c.args.dim, "d")), traced=traced)


def _rope_tensor(c: _Ctx, traced="rope") -> NamedTensor:
    p = c.args.head_dim // 2
    return NamedTensor(
        SYMBOLS["R"], (_pos(c.t), Axis(p, "pair" if p == 1 else "pairs")), "cos, sin; float32", traced
    )


def _heads(c: _Ctx, sym: str, n: int, word: str, t_axis: Axis, traced: str, note="") -> NamedTensor:
    return NamedTensor(SYMBOLS[sym], (c.B, Axis(n, word), t_axis, Axis(c.args.head_dim, "d_h")), note, traced)


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _kv_figure(c: _Ctx) -> Figure:
    a = c.args
    mha = a.replace(n_kv_heads=a.n_heads)
    per_token, mha_per_token = kv_cache_bytes(a, 1), kv_cache_bytes(mha, 1)
    full, mha_full = kv_cache_bytes(a, a.max_seq_len), kv_cache_bytes(mha, a.max_seq_len)
    kv_word = "head" if a.n_kv_heads == 1 else "heads"
    text = [f"2 (K, V) × {a.n_layers} layers × {a.n_kv_heads} {kv_word} × {a.head_dim} × {BYTES_16} bytes."]
    after = kv_cache_bytes(a, c.keys)
    if c.mode == "full":
        text.append(
            f"This call keeps no cache; one for its {_n(c.keys)} positions would hold {format_bytes(after)} "
            f"per sequence."
        )
    else:
        batch = (
            f" ({format_bytes(after * c.batch)} for {c.batch} sequences)" if isinstance(c.batch, int) else ""
        )
        text.append(
            f"After this call, at {_n(c.keys)} positions: {format_bytes(after)} in use per sequence{batch}."
        )
    text.append(
        f"At the full {_n(a.max_seq_len)} tokens: {format_bytes(full)} per sequence (MHA: {format_bytes(mha_full)})."
    )
    return Figure(
        "KV cache per token · all layers",
        (
            (f"{a.name} · 16-bit", format_bytes(per_token)),
            (f"MHA ({a.n_heads} K/V heads) · 16-bit", format_bytes(mha_per_token)),
        ),
        (" ".join(text), _grouping_text(a)),
    )


def _kv_facts(c: _Ctx) -> dict:
    a = c.args
    mha = a.replace(n_kv_heads=a.n_heads)
    return {
        "kv_bytes_per_token": kv_cache_bytes(a, 1),
        "mha_kv_bytes_per_token": kv_cache_bytes(mha, 1),
        "kv_bytes_after_call": kv_cache_bytes(a, c.keys),
        "kv_bytes_full_context": kv_cache_bytes(a, a.max_seq_len),
        "mha_kv_bytes_full_context": kv_cache_bytes(mha, a.max_seq_len),
    }


def _grouping_text(a: ModelArgs) -> str:
    if a.n_rep == 1:
        return f"No grouping: every one of the {a.n_heads} query heads has its own K/V head (MHA)."
    return (
        f"Grouping cuts W_K, W_V and the cache {a.n_rep}×; the score and value products still run over "
        f"{a.n_heads} heads."
    )


def _attention_params(c: _Ctx, block) -> Parameters:
    a, att = c.args, block.attention
    kv = f"{_n(a.dim)} × ({a.n_kv_heads} × {a.head_dim})"
    rows = (
        ("Query projection", f"{_n(a.dim)} × {_n(a.n_heads * a.head_dim)}", att.wq.weight.numel()),
        ("Key projection", kv, att.wk.weight.numel()),
        ("Value projection", kv, att.wv.weight.numel()),
        ("Output projection", f"{_n(a.n_heads * a.head_dim)} × {_n(a.dim)}", att.wo.weight.numel()),
    )
    return _params(rows, count_parameters(a).attention, a.n_layers, _numel(att), a)


def _ffn_params(c: _Ctx, block) -> Parameters:
    a, ffn = c.args, block.feed_forward
    f = a.ffn_hidden_dim
    rows = (
        ("Gate projection w1", f"{_n(a.dim)} × {_n(f)}", ffn.w1.weight.numel()),
        ("Up projection w3", f"{_n(a.dim)} × {_n(f)}", ffn.w3.weight.numel()),
        ("Down projection w2", f"{_n(f)} × {_n(a.dim)}", ffn.w2.weight.numel()),
    )
    return _params(rows, count_parameters(a).feed_forward, a.n_layers, _numel(ffn), a)


def _params(rows, accounted: int, instances: int, module_count: int, args, word="blocks") -> Parameters:
    # the module's own parameters, the rows, and accounting.py must tell the same story
    if not sum(r[2] for r in rows) == module_count == accounted:
        raise RuntimeError(
            f"parameter rows sum to {sum(r[2] for r in rows):,}, the module holds {module_count:,}, "
            f"accounting.py says {accounted:,}"
        )
    return Parameters(tuple(rows), accounted, instances, word, _config_note(args))


def _ffn_width_text(a: ModelArgs) -> str:
    if a.hidden_dim is not None:
        return f"Width set explicitly: hidden_dim = {_n(a.hidden_dim)}."
    base = int(2 * (4 * a.dim) / 3)
    steps = [f"int(2 × 4 × {_n(a.dim)} / 3) = {_n(base)}"]
    if a.ffn_dim_multiplier is not None:
        base = int(a.ffn_dim_multiplier * base)
        steps.append(f"× {a.ffn_dim_multiplier} → {_n(base)}")
    steps.append(f"rounded up to a multiple of {_n(a.multiple_of)} → {_n(a.ffn_hidden_dim)}")
    return "Width: " + "; ".join(steps) + "."


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
        f"Of {len(base)} pairs, {kept} with wavelengths under {_n(int(short))} positions are kept, {divided} over "
        f"{_n(int(long))} are divided by {a.rope_scale_factor:g}, and {blended} between are blended smoothly."
    )


def _component(name: str, c: _Ctx) -> Card:
    a = c.args
    count = count_parameters(a)
    block = _meta_model(a).layers[0]
    mode_line, state_line = _mode_lines(c)
    L = a.n_layers
    blocks_where = f"each of {L} transformer blocks"
    kw: dict = {}
    facts: dict = {}
    if name == "embedding":
        tokens = NamedTensor(SYMBOLS["tokens"], (c.B, _pos(c.t)), "int64 ids", "tokens")
        rows = (("Token embedding", f"{_n(a.vocab_size)} × {_n(a.dim)}", count.embedding),)
        emb = _meta_model(a).tok_embeddings
        kw = {
            "subtitle": "Looks up one learned d-wide row per token id.",
            "where": "before the blocks · tok_embeddings",
            "inputs": [tokens],
            "outputs": [_x(c, traced="tok_embeddings:out")],
            "parameters": _params(rows, count.embedding, 1, _numel(emb), a, word=""),
            "numbers": [
                Figure(
                    "Weights",
                    ((f"{_n(a.vocab_size)} rows · 16-bit", format_bytes(count.embedding * BYTES_16)),),
                    (
                        (
                            f"A lookup reads one row per position: {format_bytes(a.dim * BYTES_16)} at 16-bit. "
                            f"The output head is a separate (untied) {_n(a.dim)} × {_n(a.vocab_size)} matrix."
                        ),
                    ),
                )
            ],
            "sources": _sources(a, "transformer", "config"),
        }
    elif name in ("attention_norm", "ffn_norm", "norm"):
        module = {
            "attention_norm": block.attention_norm,
            "ffn_norm": block.ffn_norm,
            "norm": _meta_model(a).norm,
        }
        key = {"attention_norm": "layers.0.attention_norm", "ffn_norm": "layers.0.ffn_norm", "norm": "norm"}[
            name
        ]
        sym_in, sym_out = ("x", "x_hat") if name == "attention_norm" else ("h", "h_hat")
        where = {
            "attention_norm": f"{blocks_where} › before attention · layers[i].attention_norm",
            "ffn_norm": f"{blocks_where} › before the feed-forward · layers[i].ffn_norm",
            "norm": "after the last block · norm",
        }[name]
        instances = 1 if name == "norm" else L
        accounted = count.final_norm if name == "norm" else count.norms // 2
        kw = {
            "subtitle": "x / sqrt(mean(x²) + eps) · gain, the statistic in float32, the result in the input dtype.",
            "where": where,
            "inputs": [_x(c, sym_in, f"{key}:in")],
            "outputs": [_x(c, sym_out, f"{key}:out")],
            "parameters": _params(
                (("Gain", f"{_n(a.dim)}", module[name].weight.numel()),),
                accounted,
                instances,
                _numel(module[name]),
                a,
            ),
            "numbers": [
                Figure("Normalisation", text=(f"eps = {a.norm_eps:g}; no bias, no mean subtraction.",))
            ],
            "sources": _sources(a, "rmsnorm", "handoff" if name != "norm" else "transformer"),
        }
    elif name == "rope":
        p = a.head_dim // 2
        table = a.max_seq_len * p * 2 * BYTES_32
        kw = {
            "subtitle": "Rotates each (2p, 2p+1) channel pair of every query and key head by position · ω_p.",
            "where": f"{blocks_where} › attention, on q and k · tables in model.rope",
            "inputs": [NamedTensor(SYMBOLS["positions"], (_pos(c.t),), "the positions of this call")],
            "outputs": [_rope_tensor(c)],
            "parameters_line": "none (tables derived from the config, not learned)",
            "numbers": [
                Figure(
                    "Tables",
                    (
                        (
                            f"cos, sin · {_n(a.max_seq_len)} positions × {p} pairs · float32",
                            format_bytes(table),
                        ),
                    ),
                    (
                        f"ω_p = {a.rope_theta:,.0f}^(−2p / {a.head_dim}) before Llama 3.1 scaling. "
                        + _rope_bands(a),
                        "Hugging Face pairs channel i with i + d_h/2 instead and permutes wq, wk to match.",
                    ),
                )
            ],
            "sources": _sources(
                a, "rope", "rope-scaling", "rope-table", "hf-rope", "hf-rope-scaling", "hf-permute"
            ),
        }
    elif name == "attention":
        kw = {
            "subtitle": f"{a.n_heads} query heads read {a.n_kv_heads} key/value heads, {a.n_rep} query heads per KV head.",
            "where": f"{blocks_where} › attention · layers[i].attention",
            "inputs": [_x(c, "x", "layers.0.attention:in"), _rope_tensor(c)],
            "outputs": [_x(c, "d_attn", "layers.0.attention:out")],
            "parameters": _attention_params(c, block),
            "numbers": [_kv_figure(c)],
            "sources": _sources(
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
        }
        facts = _kv_facts(c)
    elif name == "kv_cache":
        t_new = _pos(c.t)
        read = _pos(c.keys)
        kw = {
            "subtitle": "Keys and values of every position attended to, preallocated and written by row.",
            "where": f"{blocks_where} › attention · layers[i].attention.cache",
            "inputs": [
                _heads(c, "k", a.n_kv_heads, "kv heads", t_new, "k_new"),
                _heads(c, "v", a.n_kv_heads, "kv heads", t_new, "v_new"),
            ],
            "outputs": [
                _heads(c, "K", a.n_kv_heads, "kv heads", read, "k_read"),
                _heads(c, "V", a.n_kv_heads, "kv heads", read, "v_read"),
            ],
            "parameters_line": "none (state of a generation, not weights; kept out of the state dict)",
            "numbers": [_kv_figure(c)],
            "sources": _sources(a, "kv-cache", "gqa", "generation-dtype", "hf-attention", "config"),
        }
        if c.mode != "full":
            buffer = Axis(c.batch, "batch"), Axis(a.n_kv_heads, "kv heads"), _pos(a.max_seq_len)
            kw["notes"] = [
                (
                    f"Buffers per layer: K, V [{', '.join(str(x) for x in buffer)}, {a.head_dim} d_h], "
                    f"allocated for max_seq_len = {_n(a.max_seq_len)} (minillama's layout is head-first; "
                    f"Meta's is [batch, positions, kv heads, d_h])."
                )
            ]
        facts = _kv_facts(c)
    elif name == "feed_forward":
        f = a.ffn_hidden_dim
        kw = {
            "subtitle": "w2(silu(w1 x) · w3 x): a gated expansion to the hidden width and back.",
            "where": f"{blocks_where} › feed-forward · layers[i].feed_forward",
            "inputs": [_x(c, "h_hat", "layers.0.feed_forward:in")],
            "outputs": [_x(c, "d_ffn", "layers.0.feed_forward:out")],
            "parameters": _ffn_params(c, block),
            "numbers": [
                Figure(
                    "Width and cost",
                    (
                        ("Hidden width d_ff", _n(f)),
                        ("Weights per block · 16-bit", format_bytes(count.feed_forward * BYTES_16)),
                        ("FLOPs per position", _n(2 * count.feed_forward)),
                    ),
                    (_ffn_width_text(a),),
                )
            ],
            "sources": _sources(a, "swiglu", "config", "handoff"),
        }
    elif name == "block":
        att = count.attention
        rows = (
            ("Attention RMSNorm gain", f"{_n(a.dim)}", block.attention_norm.weight.numel()),
            ("Attention wq, wk, wv, wo", _attention_calc(a), _numel(block.attention)),
            ("Feed-forward RMSNorm gain", f"{_n(a.dim)}", block.ffn_norm.weight.numel()),
            (
                "Feed-forward w1, w3, w2",
                f"3 × {_n(a.dim)} × {_n(a.ffn_hidden_dim)}",
                _numel(block.feed_forward),
            ),
        )
        kw = {
            "subtitle": "h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).",
            "where": f"{blocks_where} · layers[i]",
            "inputs": [_x(c, "x", "layers.0:in"), _rope_tensor(c)],
            "outputs": [_x(c, "x_out", "layers.0:out")],
            "parameters": _params(rows, count.per_block, L, _numel(block), a),
            "numbers": [
                Figure(
                    "Per block",
                    (
                        ("Weights · 16-bit", format_bytes(count.per_block * BYTES_16)),
                        ("Attention share", f"{att / count.per_block:.1%}"),
                        ("Feed-forward share", f"{count.feed_forward / count.per_block:.1%}"),
                        (
                            "KV cache per token · 16-bit",
                            format_bytes(kv_cache_bytes(a.replace(n_layers=1), 1)),
                        ),
                    ),
                )
            ],
            "sources": _sources(a, "handoff", "qkv", "swiglu", "rmsnorm", "config"),
        }
    elif name == "output":
        kw = {
            "subtitle": "Projects the final normalised stream to one score per vocabulary entry, in float32.",
            "where": "after the final norm · output",
            "inputs": [_x(c, "h_hat", "output:in")],
            "outputs": [
                NamedTensor(
                    SYMBOLS["logits"],
                    (c.B, _pos(c.t), Axis(a.vocab_size, "vocab")),
                    "float32 after the model's cast",
                    "output:out",
                )
            ],
            "parameters": _params(
                (("Output head", f"{_n(a.dim)} × {_n(a.vocab_size)}", count.output),),
                count.output,
                1,
                _numel(_meta_model(a).output),
                a,
                word="",
            ),
            "numbers": [
                Figure(
                    "Weights and logits",
                    (
                        ("Weights · 16-bit", format_bytes(count.output * BYTES_16)),
                        ("Logits per position · float32", format_bytes(a.vocab_size * BYTES_32)),
                    ),
                    ("Untied: a separate matrix from the token embedding.",),
                )
            ],
            "sources": _sources(a, "transformer", "logits", "config"),
        }
    elif name == "model":
        rows = tuple((c_, calc, n) for c_, calc, n in count.table() if c_ != "Total")
        model = _meta_model(a)
        one_block = _numel(model.layers[0])
        module_total = _numel(model) + (L - 1) * one_block
        figures = [
            ("Weights · 16-bit", format_bytes(weight_bytes(a, BYTES_16))),
            ("KV cache after this call · 16-bit", format_bytes(kv_cache_bytes(a, c.keys))),
            ("FLOPs per new position", _n(flops_per_token(a, c.keys))),
        ]
        if c.mode == "decode":
            figures.append(("Bytes a decode step reads at least", format_bytes(decode_step_bytes(a, c.keys))))
        kw = {
            "subtitle": f"{L} blocks between an embedding and an untied output head.",
            "where": "tokens → logits · Transformer",
            "inputs": [NamedTensor(SYMBOLS["tokens"], (c.B, _pos(c.t)), "int64 ids", "tokens")],
            "outputs": [
                NamedTensor(
                    SYMBOLS["logits"], (c.B, _pos(c.t), Axis(a.vocab_size, "vocab")), "float32", ":out"
                )
            ],
            "parameters": _params(rows, count.total, 1, module_total, a, word=""),
            "numbers": [
                Figure(
                    "Per sequence",
                    tuple(figures),
                    (
                        (
                            "FLOPs count 2 per weight of every matrix product plus the score and value products "
                            f"over {_n(c.keys)} keys; a decode step's floor reads every weight once and the cache."
                        ),
                    ),
                )
            ],
            "sources": _sources(a, "config", "context", "transformer", "logits", "handoff"),
        }
    else:  # pragma: no cover - _validate keeps this out
        raise ValueError(name)
    card = Card(
        name=name,
        kind="component",
        title=f"{a.name} · {COMPONENTS[name]}",
        mode=c.mode,
        mode_line=mode_line,
        state_line=state_line,
        checked="",
        facts={"positions": c.positions, "new_positions": c.t, "keys_read": c.keys, **facts},
        **kw,
    )
    if card.parameters is not None:
        card.parameters_line = card.parameters.line()
        card.facts |= {"per_instance": card.parameters.per_instance, "total": card.parameters.total}
    return card


def _attention_calc(a: ModelArgs) -> str:
    q = a.n_heads * a.head_dim
    kv = a.n_kv_heads * a.head_dim
    return f"2 × {_n(a.dim)} × {_n(q)} + 2 × {_n(a.dim)} × {_n(kv)}"


def _tensor(name: str, c: _Ctx) -> Card:
    a = c.args
    mode_line, state_line = _mode_lines(c)
    t_axis, keys_axis = _pos(c.t), _pos(c.keys, "key", "keys")
    att = f"each of {a.n_layers} transformer blocks › attention"
    n_read = c.keys
    per_seq = {}
    if name in ("xq", "xk", "xv"):
        n, word, sym, traced = {
            "xq": (a.n_heads, "heads", "Q", "q"),
            "xk": (a.n_kv_heads, "kv heads", "K", "k_new"),
            "xv": (a.n_kv_heads, "kv heads", "V", "v_new"),
        }[name]
        tensor = _heads(c, sym, n, word, t_axis, traced)
        subtitle = {
            "xq": f"Query vectors, one per query head; heads grouped as ({a.n_kv_heads} kv × {a.n_rep} g), "
            f"query head i reads KV head i // {a.n_rep}.",
            "xk": "Key feature vectors organised into the smaller KV-head collection, rotated by RoPE.",
            "xv": "Value vectors organised into the KV heads; not rotated.",
        }[name]
        sources = _sources(a, "attn-reshape", "qkv", "rope" if name != "xv" else "gqa", "config")
        per_seq = {"elements": c.t * n * a.head_dim}
    elif name in ("cache_k", "cache_v"):
        sym = "K" if name == "cache_k" else "V"
        tensor = _heads(c, sym, a.n_kv_heads, "kv heads", _pos(n_read), "k_read" if sym == "K" else "v_read")
        what = "keys" if sym == "K" else "values"
        subtitle = (
            f"The {what} attention reads this call: rows 0–{_n(n_read - 1)} of the layer's cache."
            if c.mode != "full"
            else f"No cache in full-sequence mode: the {what} read are this call's own."
        )
        sources = _sources(a, "kv-cache", "gqa", "hf-attention")
        per_seq = {"elements": n_read * a.n_kv_heads * a.head_dim}
    elif name in ("scores", "probs"):
        sym = "S" if name == "scores" else "A"
        tensor = NamedTensor(
            SYMBOLS[sym],
            (c.B, Axis(a.n_heads, "heads"), t_axis, keys_axis),
            "q·k / sqrt(d_h) plus the causal mask" if name == "scores" else "softmax over keys, in float32",
            name,
        )
        subtitle = (
            "One score per query head, new position and key read."
            if name == "scores"
            else "Attention weights: each row sums to 1 over the keys a position may read."
        )
        sources = _sources(a, "scores", "gqa")
        per_seq = {"elements": a.n_heads * c.t * n_read}
    elif name == "attn_out":
        tensor = NamedTensor(
            SYMBOLS["O"],
            (c.B, t_axis, Axis(a.n_heads * a.head_dim, f"({a.n_heads} heads × {a.head_dim} d_h)")),
            "heads merged, before wo",
            "layers.0.attention.wo:in",
        )
        subtitle = "The weighted values of every head, merged back to one vector per position."
        sources = _sources(a, "retrieval")
        per_seq = {"elements": c.t * a.n_heads * a.head_dim}
    elif name == "residual":
        tensor = _x(c, "x", "layers.0:out")
        subtitle = "The stream every block reads from and adds its attention and feed-forward updates to."
        sources = _sources(a, "handoff", "config")
        per_seq = {"elements": c.t * a.dim}
    elif name == "ffn_hidden":
        tensor = NamedTensor(
            SYMBOLS["u"],
            (c.B, t_axis, Axis(a.ffn_hidden_dim, "d_ff")),
            "silu(w1 x) · w3 x",
            "layers.0.feed_forward.w2:in",
        )
        subtitle = "The gated hidden activations of the feed-forward, the widest tensor of a block."
        sources = _sources(a, "swiglu", "config")
        per_seq = {"elements": c.t * a.ffn_hidden_dim}
    else:  # pragma: no cover
        raise ValueError(name)
    where = {
        "residual": f"between the blocks, {a.n_layers + 1} times · layers[i] input and output",
        "ffn_hidden": f"each of {a.n_layers} transformer blocks › feed-forward · input of w2",
        "attn_out": f"{att} · input of wo",
    }.get(name, f"{att} · {name}")
    elements = per_seq["elements"]
    figures = [(f"Elements per sequence{' per layer' if name not in ('residual',) else ''}", _n(elements))]
    figures.append(("At 16-bit", format_bytes(elements * BYTES_16)))
    text = []
    if name in ("cache_k", "cache_v") and c.mode != "full":
        allocated = a.max_seq_len * a.n_kv_heads * a.head_dim * BYTES_16
        figures.append((f"Allocated for {_n(a.max_seq_len)} positions · 16-bit", format_bytes(allocated)))
    if name in ("scores", "probs"):
        text.append(
            "minillama calls F.scaled_dot_product_attention, which may compute these blockwise without storing "
            "them; the shape is that of the reference's scores tensor."
        )
    card = Card(
        name=name,
        kind="tensor",
        title=f"{a.name} · {TENSORS[name]} · {name}",
        subtitle=subtitle,
        where=where,
        mode=c.mode,
        mode_line=mode_line,
        state_line=state_line,
        tensor=tensor,
        numbers=[Figure("Size", tuple(figures), tuple(text))],
        sources=sources,
        facts={"positions": c.positions, "new_positions": c.t, "keys_read": c.keys, "elements": elements},
    )
    return card


def _finish(card: Card, c: _Ctx) -> Card:
    batch = c.batch if isinstance(c.batch, int) else _STAND_IN
    _check_shapes(card, c.args, batch)
    stand_in = f" (batch {c.batch} traced as {batch})" if isinstance(c.batch, str) else ""
    card.checked = (
        f"Shapes checked against minillama's modules run on the meta device in {MODE_TITLES[c.mode].lower()} "
        f"mode{stand_in}; counts from minillama.accounting."
    )
    return card


def card(
    name: str, args: ModelArgs, mode: str = "decode", positions: int = 1000, batch: int | str = "B"
) -> Card:
    """The card of a component: one of `COMPONENTS` ("embedding", "attention_norm", "ffn_norm", "norm",
    "rope", "attention", "kv_cache", "feed_forward", "block", "output", "model").

    `mode`: "full", "prefill" or "decode". `positions`: P cached positions in decode (L = P + 1 keys
    read), T new positions otherwise. `batch`: a symbol such as "B", or an int."""
    _validate(name, COMPONENTS, args, mode, positions, batch)
    c = _ctx(args, mode, positions, batch)
    return _finish(_component(name, c), c)


def tensor_card(
    name: str, args: ModelArgs, mode: str = "decode", positions: int = 1000, batch: int | str = "B"
) -> Card:
    """The card of a tensor: one of `TENSORS` ("xq", "xk", "xv", "cache_k", "cache_v", "scores",
    "probs", "attn_out", "residual", "ffn_hidden"); arguments as for `card`."""
    _validate(name, TENSORS, args, mode, positions, batch)
    c = _ctx(args, mode, positions, batch)
    return _finish(_tensor(name, c), c)


# the three modes as tabs


_tab_counter = itertools.count()


@dataclass
class CardTabs:
    """One card in the three modes, as CSS-only tabs (radio inputs and labels: no JavaScript, so it
    works in static HTML and in JupyterLab)."""

    cards: dict[str, Card]

    def _id(self) -> str:
        first = next(iter(self.cards.values()))
        digest = hashlib.sha1(first.title.encode() + str(first.facts["positions"]).encode()).hexdigest()[:8]
        return f"ml-tabs-{digest}-{next(_tab_counter)}"

    def html(self) -> str:
        uid = self._id()
        inputs, labels, panels, rules = [], [], [], []
        for i, (mode, c) in enumerate(self.cards.items()):
            checked = " checked" if mode == "decode" else ""
            inputs.append(f"<input type='radio' name='{uid}' id='{uid}-{i}' class='ml-tab-input'{checked}>")
            labels.append(f"<label for='{uid}-{i}' class='ml-tab-label'>{MODE_TITLES[mode]}</label>")
            panels.append(f"<div class='ml-tab-panel ml-tab-panel-{i}'>{c.html_body()}</div>")
            rules.append(
                f"#{uid}-{i}:checked ~ .ml-tab-panels > .ml-tab-panel-{i}{{display:block}}"
                f"#{uid}-{i}:checked ~ label[for='{uid}-{i}']{{opacity:1;border-bottom-color:currentColor}}"
            )
        style = (
            "<style>.ml-tabs>.ml-tab-input{position:absolute;opacity:0;pointer-events:none}"
            ".ml-tabs>.ml-tab-label{display:inline-block;padding:.25em .9em;margin-right:.2em;cursor:pointer;"
            "opacity:.65;border-bottom:2px solid transparent}"
            ".ml-tabs .ml-tab-panel{display:none;padding-top:.5em;border-top:1px solid rgba(127,127,127,.25)}"
            + "".join(rules)
            + "</style>"
        )
        return (
            f"<div class='ml-card ml-tabs'>{_STYLE}{style}{''.join(inputs)}{''.join(labels)}"
            f"<div class='ml-tab-panels'>{''.join(panels)}</div></div>"
        )

    def _repr_html_(self) -> str:
        return self.html()

    def markdown(self) -> str:
        return "\n\n".join(f"### {MODE_TITLES[m]}\n\n{c.markdown()}" for m, c in self.cards.items())

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __str__(self) -> str:
        return "\n\n".join(f"== {MODE_TITLES[m]} ==\n{c}" for m, c in self.cards.items())


def card_tabs(name: str, args: ModelArgs, positions: int = 1000, batch: int | str = "B") -> CardTabs:
    """`card` (or `tensor_card`, by name) in full-sequence, prefill and decode mode, shown as tabs."""
    make = tensor_card if name in TENSORS else card
    if name not in TENSORS and name not in COMPONENTS:
        raise ValueError(
            f"unknown card {name!r}; components: {', '.join(COMPONENTS)}; tensors: {', '.join(TENSORS)}"
        )
    return CardTabs({mode: make(name, args, mode=mode, positions=positions, batch=batch) for mode in MODES})


# the command line: python -m minillama card attention --model llama-3.1-8b --mode decode --positions 1000


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2, as the rest of the CLI (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main_card(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m minillama card", description="Print a component or tensor card.")
    parser.add_argument(
        "name", help=f"a component ({', '.join(COMPONENTS)}) or a tensor ({', '.join(TENSORS)})"
    )
    parser.add_argument("--model", default="llama-3.1-8b", choices=list(MODELS))
    parser.add_argument("--mode", default="decode", choices=list(MODES))
    parser.add_argument(
        "--positions", type=int, default=1000, help="P cached positions (decode) or T new ones"
    )
    parser.add_argument("--batch", default="B", help="a symbol, or a number of sequences")
    parser.add_argument("--format", default="text", choices=("text", "markdown", "html"))
    ns = parser.parse_args(argv)
    batch = int(ns.batch) if ns.batch.isdigit() else ns.batch
    make = tensor_card if ns.name in TENSORS else card
    try:
        result = make(ns.name, MODELS[ns.model], mode=ns.mode, positions=ns.positions, batch=batch)
    except ValueError as error:
        parser.error(str(error))
    print({"text": str, "markdown": Card.markdown, "html": Card.html}[ns.format](result))
    return 0
