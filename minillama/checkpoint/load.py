"""Loading: a `Transformer` with a checkpoint's weights, in any of the three layouts (chapter 6).

Loading is memory-lean: the model is built on the `meta` device (no storage), each tensor is read from a
memory-mapped file straight to the target device and dtype, and `load_state_dict(assign=True)` adopts
the tensors. `benchmarks/load_memory.py` measures peak RSS against the file size. Every name, shape and
dtype is checked before any weight is read (`check.py`). Not here: the layouts' readers
(`read_hf.py`, `read_meta.py`, `read_gguf.py`), saving (`save.py`).
"""

from __future__ import annotations

import os

import torch

from ..model import Transformer
from .check import SUPPORTED_DTYPES
from .configs import load_args
from .layout import HF_CONFIG, detect_layout, read_json
from .read_gguf import read_gguf
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


def _check_tied_head(state: dict, path) -> None:
    """A tied checkpoint may store the head too (Meta's files): it must then equal the embedding."""
    head, embedding = state.get("output.weight"), state["tok_embeddings.weight"]
    if head is not None and head is not embedding and not torch.equal(head, embedding):
        raise ValueError(
            f"{path}: the config ties the output head to the embedding, but the checkpoint's "
            f"output.weight differs from tok_embeddings.weight; untie it in the config or fix the weights"
        )


def load(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    progress: bool = True,
    max_seq_len: int | None = None,
    mesh=None,
) -> Transformer:
    """A `Transformer` with the weights of the checkpoint at `path` (layout detected, see the module docstring).

    `dtype` None keeps the checkpoint's dtype (bfloat16 for Meta's and Hugging Face's releases; for a
    GGUF file its 16-bit type when its weights are all F16 or all BF16, else float32: quantised blocks
    are dequantised).
    `max_seq_len` caps the context (the rotary tables, the largest cache `setup_cache` accepts); None
    keeps the config's (131,072 for Llama 3.1). `mesh`: a 1-D `DeviceMesh` to load tensor-parallel
    (chapter 11), each rank reading only its own slices (`parallel.py`); call it on every rank. On a
    CUDA mesh the default device is the rank's GPU."""
    if mesh is not None:
        from .parallel import load_parallel

        explicit = torch.device(device).type == mesh.device_type
        return load_parallel(path, mesh, device if explicit else None, dtype, max_seq_len)
    dtype = _resolve_dtype(dtype)
    device = torch.device(device)
    layout, root = detect_layout(path)
    args = load_args(root)
    if max_seq_len is not None:
        args = args.replace(max_seq_len=max_seq_len)
    tied = args.tie_embeddings  # HF: tie_word_embeddings; Meta: the catalogue (Llama 3.2 1B/3B)
    with torch.device("meta"):
        model = Transformer(args)
    quantization = read_json(root / HF_CONFIG).get("minillama", {}).get("quantization") if layout == "hf" else None
    if quantization:  # written by `save` from a quantised model (chapter 9): the same layers, empty
        from ..quantize import quantized_like

        quantized_like(model, quantization)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    codes = {name: t.dtype for name, t in model.state_dict().items() if not t.is_floating_point()}
    if layout == "gguf":
        state = read_gguf(root, args, expected, device, dtype, progress, tied)
    elif layout == "hf":
        state = read_hf(root, args, expected, device, dtype, progress, tied, codes)
    else:
        state = read_meta(root, args, expected, device, dtype, progress, tied)
    if tied:
        _check_tied_head(state, path)
        state["output.weight"] = state["tok_embeddings.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    # the rotary tables are derived, not stored: .to(device) rebuilds them there (see RotaryEmbedding._apply)
    return model.to(device).eval()
