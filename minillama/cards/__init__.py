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

Where things live:
- `tensors.py`: numbers as cards print them, the book's symbols, tensors with named axes;
- `card.py`: what a card holds (`Card`, `Parameters`, `Figure`); `render.py`: text, Markdown, HTML;
- `trace.py`: the meta-device run that checks a card's shapes against the code;
- `context.py`: the call (mode, P/T, L) and the pieces every builder shares;
- `components.py`, `attention_cards.py`, `tensor_cards.py`: one builder per card;
- `catalogue.py`: the one table, name -> builder (adding a card: one function, one row);
- `build.py`: `card`, `tensor_card`; `tabs.py`: `card_tabs`; `cli.py`: `python -m minillama card`.
"""

from .build import card, tensor_card
from .card import Card, Figure, Parameters
from .catalogue import CARDS, COMPONENTS, TENSORS
from .cli import main_card
from .context import MODE_TITLES, MODES
from .tabs import CardTabs, card_tabs
from .tensors import BYTES_16, BYTES_32, SYMBOLS, Axis, NamedTensor, Symbol, format_bytes

__all__ = [
    "BYTES_16",
    "BYTES_32",
    "CARDS",
    "COMPONENTS",
    "MODES",
    "MODE_TITLES",
    "SYMBOLS",
    "TENSORS",
    "Axis",
    "Card",
    "CardTabs",
    "Figure",
    "NamedTensor",
    "Parameters",
    "Symbol",
    "card",
    "card_tabs",
    "format_bytes",
    "main_card",
    "tensor_card",
]
