"""The check every checkpoint passes before a weight is read: names, shapes and dtypes (chapter 6).

A bad checkpoint fails in milliseconds with the name of the tensor at fault and both shapes. Not here:
reading the tensor list of a layout (`read_hf.py`, `read_meta.py`).
"""

from __future__ import annotations

import re

import torch

from ..config import ModelArgs
from .names import meta_to_hf

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LAYER_RE = re.compile(r"layers\.(\d+)\.")


def _describe(args: ModelArgs) -> str:
    return (
        f"dim={args.dim}, n_layers={args.n_layers}, n_heads={args.n_heads}, n_kv_heads={args.n_kv_heads}, "
        f"vocab_size={args.vocab_size}, ffn width={args.ffn_hidden_dim}"
    )


def check_tensors(
    found: dict, expected: dict, args: ModelArgs, config: str, hf: bool, tied: bool, codes=None
) -> None:
    """Raise on any unexpected, missing, mis-shaped or unsupported tensor. `found`: Meta name ->
    (shape, dtype, where it was found: "file: stored name"); `codes`: name -> integer dtype of a quantised
    model's codes (chapter 9)."""
    codes = codes or {}
    layers = {int(m.group(1)) for name in found if (m := _LAYER_RE.match(name))}
    if layers and max(layers) >= args.n_layers:
        raise ValueError(
            f"{config} says n_layers={args.n_layers} but the weights hold layers 0..{max(layers)} "
            f"({len(layers)} layers): the config and the weights disagree"
        )
    for name, (shape, dtype, where) in found.items():
        if name not in expected:
            raise ValueError(
                f"unexpected tensor {where}: the model of {config} ({_describe(args)}) has no {name!r}"
            )
        if tuple(shape) != tuple(expected[name]):
            raise ValueError(
                f"shape mismatch for {name!r} ({where}): expected {tuple(expected[name])} from {config} "
                f"({_describe(args)}), found {tuple(shape)}; the config and the weights disagree"
            )
        if name in codes and dtype != codes[name]:
            raise ValueError(f"{where} holds {dtype}; the quantised model of {config} stores {codes[name]} codes there")
        if dtype not in SUPPORTED_DTYPES and name not in codes:
            raise ValueError(
                f"unsupported dtype {dtype} for {where}: minillama loads float32, float16 and bfloat16 weights "
                f"(quantized checkpoints such as fp8 are not supported)"
            )
    missing = [name for name in expected if name not in found and not (tied and name == "output.weight")]
    if missing:
        shown = ", ".join(repr(meta_to_hf(n) if hf else n) for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(
            f"missing tensor {shown}{more} (the model of {config} needs {len(expected)} tensors)"
        )
