"""The command line of the cards: `python -m minillama card attention --model llama-3.1-8b --mode decode
--positions 1000` prints a card as text, Markdown or HTML (all chapters).

Not here: making or drawing a card (`build.py`, `render.py`).
"""

from __future__ import annotations

import argparse

from ..config import MODELS
from .build import card, tensor_card
from .card import Card
from .catalogue import COMPONENTS, TENSORS
from .context import MODES


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
