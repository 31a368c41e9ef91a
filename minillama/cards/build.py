"""Making a card: `card` and `tensor_card` check the call, look the builder up in the catalogue, give
the card its title and mode lines, and check its shapes against the code (all chapters).

Not here: what any one card says (`components.py`, `attention_cards.py`, `tensor_cards.py`), how the
shapes are traced (`trace.py`), how a card is drawn (`render.py`).
"""

from __future__ import annotations

from ..config import ModelArgs
from .card import Card
from .catalogue import CARDS, COMPONENTS, TENSORS
from .context import MODE_TITLES, Ctx, make_ctx, mode_lines, validate
from .trace import check_shapes

_STAND_IN = 2  # the concrete batch a symbolic "B" is traced with (2, so it cannot pass for a broadcast 1)


def _assemble(name: str, c: Ctx) -> Card:
    entry = CARDS[name]
    kw = entry.build(c)
    facts = kw.pop("facts", {})
    mode_line, state_line = mode_lines(c, entry.kv)
    title = f"{c.args.name} · {entry.title}" + (f" · {name}" if entry.kind == "tensor" else "")
    card = Card(
        name=name,
        kind=entry.kind,
        title=title,
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


def _finish(card: Card, c: Ctx) -> Card:
    batch = c.batch if isinstance(c.batch, int) else _STAND_IN
    check_shapes(card, c.args, batch)
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
    validate(name, COMPONENTS, "card", args, mode, positions, batch)
    c = make_ctx(args, mode, positions, batch)
    return _finish(_assemble(name, c), c)


def tensor_card(
    name: str, args: ModelArgs, mode: str = "decode", positions: int = 1000, batch: int | str = "B"
) -> Card:
    """The card of a tensor: one of `TENSORS` ("xq", "xk", "xv", "cache_k", "cache_v", "scores",
    "probs", "attn_out", "residual", "ffn_hidden"); arguments as for `card`."""
    validate(name, TENSORS, "tensor", args, mode, positions, batch)
    c = make_ctx(args, mode, positions, batch)
    return _finish(_assemble(name, c), c)
