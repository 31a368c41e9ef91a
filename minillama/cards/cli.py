"""The command line of the cards: `python -m minillama card attention --model llama-3.1-8b --mode decode
--positions 1000` prints a card as text, Markdown or HTML (all chapters).

Not here: making or drawing a card (`build.py`, `render.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import MODELS, ModelArgs, unknown_model
from .build import card, tensor_card
from .card import Card
from .catalogue import COMPONENTS, TENSORS
from .context import MODES


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2, as the rest of the CLI (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _shape(name: str, parser) -> ModelArgs:
    """A catalogue entry, or the config of a checkpoint folder (as `count` and `generate` take)."""
    if name in MODELS:
        return MODELS[name]
    if Path(name).expanduser().is_dir():
        from ..checkpoint import load_args

        try:
            return load_args(Path(name).expanduser())
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
    if Path(name).expanduser().is_file():
        parser.error(f"{name} is a file; --model takes a catalogue name or a checkpoint folder")
    parser.error(f"{unknown_model(name, MODELS)} (or a checkpoint folder)")


def main_card(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(
        prog="python -m minillama card",
        description="Print a component or tensor card.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "name", help=f"a component ({', '.join(COMPONENTS)}) or a tensor ({', '.join(TENSORS)})"
    )
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help=f"a catalogue name ({', '.join(MODELS)}) or a checkpoint folder (its config is read, no weights)",
    )
    parser.add_argument("--mode", default="decode", choices=list(MODES), help="what the card traces")
    parser.add_argument(
        "--positions", type=int, default=1000, help="P cached positions (decode) or T new ones"
    )
    parser.add_argument("--batch", default="B", help="a symbol, or a number of sequences")
    parser.add_argument("--format", default="text", choices=("text", "markdown", "html"), help="output format")
    ns = parser.parse_args(argv)
    args = _shape(ns.model, parser)
    batch = int(ns.batch) if ns.batch.isdigit() else ns.batch
    make = tensor_card if ns.name in TENSORS else card
    try:
        result = make(ns.name, args, mode=ns.mode, positions=ns.positions, batch=batch)
    except ValueError as error:
        parser.error(str(error))
    print({"text": str, "markdown": Card.markdown, "html": Card.html}[ns.format](result))
    return 0
