"""Loading: a `Transformer` with a checkpoint's weights, in either layout (chapter 6).

Loading is memory-lean: the model is built on the `meta` device (no storage), each tensor is read from a
memory-mapped file straight to the target device and dtype, and `load_state_dict(assign=True)` adopts
the tensors. `benchmarks/load_memory.py` measures peak RSS against the file size. Every name, shape and
dtype is checked before any weight is read (`check.py`). Not here: the two layouts' readers
(`read_hf.py`, `read_meta.py`), saving (`save.py`).
"""

from __future__ import annotations

import os

import torch

from ..model import Transformer
from .check import SUPPORTED_DTYPES
from .configs import load_args
from .layout import HF_CONFIG, detect_layout, read_json
from .read_hf import read_hf
from .read_meta import read_meta

_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _resolve_dtype(dtype) -> torch.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in _DTYPE_NAMES:
            raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_DTYPE_NAMES)}")
        return _DTYPE_NAMES[dtype.removeprefix("torch.")]
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype}; minillama runs in float32, float16 or bfloat16")
    return dtype


def load(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    progress: bool = True,
    max_seq_len: int | None = None,
) -> Transformer:
    """A `Transformer` with the weights of the checkpoint at `path` (layout detected, see the module docstring).

    `dtype` None keeps the checkpoint's dtype (bfloat16 for Meta's and Hugging Face's releases).
    `max_seq_len` caps the context (the rotary tables, the largest cache `setup_cache` accepts); None
    keeps the config's (131,072 for Llama 3.1)."""
    dtype = _resolve_dtype(dtype)
    device = torch.device(device)
    layout, root = detect_layout(path)
    args = load_args(root)
    if max_seq_len is not None:
        args = args.replace(max_seq_len=max_seq_len)
    tied = False
    if layout == "hf":
        tied = bool(read_json(root / HF_CONFIG).get("tie_word_embeddings", False))
    with torch.device("meta"):
        model = Transformer(args)
    quantization = (
        read_json(root / HF_CONFIG).get("minillama", {}).get("quantization") if layout == "hf" else None
    )
    if quantization:  # written by `save` from a quantised model (chapter 9): the same layers, empty
        from ..quantize import quantized_like

        quantized_like(model, quantization)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    codes = {name: t.dtype for name, t in model.state_dict().items() if not t.is_floating_point()}
    if layout == "hf":
        state = read_hf(root, args, expected, device, dtype, progress, tied, codes)
    else:
        state = read_meta(root, args, expected, device, dtype, progress)
    if tied:
        state["output.weight"] = state["tok_embeddings.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    # the rotary tables are derived, not stored: .to(device) rebuilds them there (see RotaryEmbedding._apply)
    return model.to(device).eval()
