"""How a card is drawn: plain text, Markdown and HTML, and the card's style sheet (all chapters).

Each function here reads a `Card` (`card.py`) and writes it out; none computes a number. Not here: what
goes on a card (`components.py`, `tensor_cards.py`), the tabs of the three modes (`tabs.py`).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .tensors import commas

if TYPE_CHECKING:
    from .card import Card


def _fact_lines(card: Card, show, in_label: str, sep: str) -> list[str]:
    """The tensor, in, out, parameters, mode and state lines of text and Markdown (`show` draws a tensor)."""
    lines = []
    if card.tensor is not None:
        lines.append(f"tensor: {show(card.tensor)}")
    if card.inputs:
        lines.append(in_label + sep.join(show(t) for t in card.inputs))
    if card.outputs:
        lines.append("out: " + sep.join(show(t) for t in card.outputs))
    if card.parameters_line:
        lines.append(f"parameters: {card.parameters_line}")
    return lines + [f"mode: {card.mode_line}", f"state: {card.state_line}"]


def text(card: Card) -> str:
    """The card as plain text, for a terminal."""
    out = [card.title, card.subtitle, f"where: {card.where}", ""]
    out += _fact_lines(card, lambda t: t.text(), "in:  ", "   ")
    if card.parameters is not None:
        p = card.parameters
        out += [
            "",
            "Parameters",
            f"{commas(p.per_instance)} parameters per instance, across its learned components",
        ]
        rows = [("Component", "Calculation", "Parameters")]
        rows += [(c, calc, commas(n)) for c, calc, n in p.rows]
        rows.append(("Per-instance total", "", commas(p.per_instance)))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            out.append(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}")
        out.append(p.across())
        if p.note:
            out.append(p.note)
    if card.numbers:
        out += ["", "In numbers"]
        for fig in card.numbers:
            out.append(fig.heading)
            width = max((len(label) for label, _ in fig.rows), default=0)
            out += [f"  {label:<{width}}  {value}" for label, value in fig.rows]
            out += list(fig.text)
    if card.notes:
        out += [""] + card.notes
    out += ["", f"Sources ({len(card.sources)})"]
    for s in card.sources:
        out.append(f"  {s.label} · {s.evidence} · {s.claim}")
        out.append(f"    {s.repo} @ {s.short_revision}: {s.url}")
    out += ["", card.checked]
    return "\n".join(out)


def markdown(card: Card) -> str:
    """The card as Markdown, for Jupyter and the book."""
    out = [f"**{card.title}**", "", f"*{card.subtitle}* · where: {card.where}", ""]
    lines = _fact_lines(card, lambda t: t.markdown(), "in: ", " ")
    out += [line + "  " for line in lines[:-1]] + lines[-1:]
    if card.parameters is not None:
        p = card.parameters
        out += [
            "",
            "**Parameters**",
            "",
            f"{commas(p.per_instance)} parameters per instance, across its learned components",
            "",
            "| Component | Calculation | Parameters |",
            "|---|---|---:|",
        ]
        out += [f"| {c} | {calc} | {commas(n)} |" for c, calc, n in p.rows]
        out += [f"| **Per-instance total** | | **{commas(p.per_instance)}** |", "", p.across()]
        if p.note:
            out += ["", p.note]
    if card.numbers:
        out += ["", "**In numbers**"]
        for fig in card.numbers:
            out += ["", f"*{fig.heading}*", ""]
            if fig.rows:
                out += ["| | |", "|---|---:|"] + [f"| {label} | {value} |" for label, value in fig.rows]
                out.append("")
            out += list(fig.text)
    if card.notes:
        out += [""] + card.notes
    out += ["", f"**Sources** ({len(card.sources)})", ""]
    out += [f"- {s.markdown()}" for s in card.sources]
    out += ["", f"*{card.checked}*"]
    return "\n".join(out)


def html_body(card: Card) -> str:
    """The card's HTML without its frame and style, for JupyterLab and the static site."""
    e = html.escape
    out = [
        f"<div class='ml-title'>{e(card.title)}</div>",
        f"<div class='ml-dim'>{e(card.subtitle)} · where: {e(card.where)}</div>",
        "<dl class='ml-facts'>",
    ]
    if card.tensor is not None:
        out.append(f"<dt>tensor</dt><dd>{card.tensor.html()}</dd>")
    if card.inputs:
        out.append(f"<dt>in</dt><dd>{' '.join(t.html() for t in card.inputs)}</dd>")
    if card.outputs:
        out.append(f"<dt>out</dt><dd>{' '.join(t.html() for t in card.outputs)}</dd>")
    if card.parameters_line:
        out.append(f"<dt>parameters</dt><dd>{e(card.parameters_line)}</dd>")
    out.append(f"<dt>mode</dt><dd>{e(card.mode_line)}</dd><dt>state</dt><dd>{e(card.state_line)}</dd></dl>")
    if card.parameters is not None:
        p = card.parameters
        out += [
            "<div class='ml-h'>Parameters</div>",
            f"<div>{commas(p.per_instance)} parameters per instance, across its learned components</div>",
            (
                "<table class='ml-table'><thead><tr><th>Component</th><th>Calculation</th>"
                "<th class='ml-num'>Parameters</th></tr></thead><tbody>"
            ),
        ]
        out += [
            f"<tr><td>{e(c)}</td><td>{e(calc)}</td><td class='ml-num'>{commas(n)}</td></tr>"
            for c, calc, n in p.rows
        ]
        out.append(
            f"<tr class='ml-total'><td>Per-instance total</td><td></td>"
            f"<td class='ml-num'>{commas(p.per_instance)}</td></tr></tbody></table>"
        )
        out.append(f"<div>{e(p.across())}</div>")
        if p.note:
            out.append(f"<div class='ml-dim'>{e(p.note)}</div>")
    if card.numbers:
        out.append("<div class='ml-h'>In numbers</div>")
        for fig in card.numbers:
            out.append(f"<div class='ml-sub'>{e(fig.heading)}</div>")
            if fig.rows:
                out.append("<table class='ml-table ml-figures'><tbody>")
                out += [
                    f"<tr><td>{e(label)}</td><td class='ml-num'><b>{e(value)}</b></td></tr>"
                    for label, value in fig.rows
                ]
                out.append("</tbody></table>")
            out += [f"<div>{e(t)}</div>" for t in fig.text]
    out += [f"<div class='ml-dim'>{e(n)}</div>" for n in card.notes]
    out.append(f"<div class='ml-h'>Sources ({len(card.sources)})</div><ul class='ml-sources'>")
    for s in card.sources:
        out.append(
            f"<li><a href='{e(s.url)}'>{e(s.label)}</a> <span class='ml-dim'>· {e(s.evidence)} · "
            f"{e(s.repo)} @ <code>{e(s.short_revision)}</code></span><br>{e(s.claim)}</li>"
        )
    out.append(f"</ul><div class='ml-dim'>{e(card.checked)}</div>")
    return "\n".join(out)


# colours are inherited (currentColor) and borders translucent, so the card reads in light and dark themes
STYLE = """<style>
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
