"""How a card is checked: the real modules run on the `meta` device (all chapters).

The model is built on the `meta` device (no memory, no compute) with one block (every block is alike),
run in the card's mode with forward hooks on every module, a wrapper around the KV cache's `update` and
a recorder of the attention kernel's q, k, v; `check_shapes` compares every tensor a card prints with
the shape the code produced, so a card cannot disagree with the code. Not here: what a card says
(`components.py`, `tensor_cards.py`) or how it is drawn (`render.py`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..config import ModelArgs
from ..model import Transformer

if TYPE_CHECKING:
    from .card import Card


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
def meta_model(args: ModelArgs) -> Transformer:
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
def trace_shapes(args: ModelArgs, mode: str, positions: int, batch: int) -> dict:
    """Run one block of the model on the meta device in `mode` and record the shape of every module's
    first input and output, of the keys/values written into the cache, and of the attention kernel's
    q, k, v. Returns {"<module>:in" / "<module>:out" / "cache_write" / "kernel" / "cache_buffer": shape}."""
    model = meta_model(args)
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


def check_shapes(card: Card, args: ModelArgs, batch: int) -> None:
    trace = trace_shapes(args, card.mode, card.facts["positions"], batch)
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
