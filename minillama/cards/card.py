"""What a card is: the data a card holds, independent of any one component (all chapters).

A `Card` holds a title, where the piece sits in the model, its `in:`/`out:` tensors (or the one tensor
of a tensor card), its learned `Parameters` (per instance and across the blocks), the mode and cache
lines, `Figure`s "in numbers", the pinned sources and the raw `facts` behind it. Not here: how a card is
drawn (`render.py`: text, Markdown, HTML), how its shapes are checked (`trace.py`), what goes on the card
of each component or tensor (`components.py`, `tensor_cards.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sources import Source
from . import render
from .tensors import NamedTensor, commas


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
            return commas(self.per_instance)
        return f"{commas(self.per_instance)} × {self.instances} {self.instance_word} = {commas(self.total)}"

    def across(self) -> str:
        if self.instances == 1:
            return f"One instance: {commas(self.total)} parameters."
        return (
            f"Across {self.instances} independent {self.instance_word}: {commas(self.per_instance)} × "
            f"{self.instances} = {commas(self.total)} parameters."
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

    def __str__(self) -> str:  # plain text, for a terminal
        return render.text(self)

    def markdown(self) -> str:  # for Jupyter and the book
        return render.markdown(self)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def html_body(self) -> str:  # for JupyterLab and the static site
        return render.html_body(self)

    def html(self) -> str:
        return f"<div class='ml-card'>{render.STYLE}\n{self.html_body()}\n</div>"

    def _repr_html_(self) -> str:
        return self.html()
