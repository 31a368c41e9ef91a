"""Tensors with named axes, and the numbers a card prints (all chapters).

Here: how a number is written on a card (`format_bytes`, thousands separators, cache row ranges), the
symbols of the book (x, x̂, Q, K, ... in text, TeX and HTML) and `NamedTensor`, a tensor described by
its axes (`x [B batch, 1 position, 4096 d]`). Not here: what a card holds (`card.py`), how it is
drawn (`render.py`), which cards exist (`catalogue.py`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

BYTES_16 = 2  # bf16 / fp16, the width Meta's generation runs at (sources: generation-dtype)
BYTES_32 = 4


# numbers as the cards print them


def commas(x: int) -> str:
    return f"{x:,}"


def format_bytes(n: float) -> str:
    """Binary units, one decimal where not integral: 131072 -> "128 KiB", 131203072 -> "125.1 MiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value):,} {units[unit]}" if value == int(value) else f"{value:,.1f} {units[unit]}"


def rows_text(a: int, b: int) -> str:
    return f"row {commas(a)}" if a == b else f"rows {commas(a)}–{commas(b)}"


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
        size = commas(self.size) if self.positions or self.size >= 10_000 else str(self.size)
        return f"{size} {self.name}"


def pos_axis(n: int, singular="position", plural="positions") -> Axis:
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
