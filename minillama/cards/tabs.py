"""One card in the three modes, as tabs: CSS-only (radio inputs and labels, no JavaScript), so they
work in static HTML and in JupyterLab (all chapters).

Not here: a single card (`card.py`, `render.py`) or which cards exist (`catalogue.py`).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

from ..config import ModelArgs
from .build import card, tensor_card
from .card import Card
from .catalogue import COMPONENTS, TENSORS
from .context import MODE_TITLES, MODES
from .render import STYLE

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
            f"<div class='ml-card ml-tabs'>{STYLE}{style}{''.join(inputs)}{''.join(labels)}"
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
