"""Reading a Hugging Face checkpoint's weights: safetensors, HF names, wq/wk un-permuted (chapter 6).

Each tensor is a view of a memory-mapped file until it is converted to the target device and dtype
(no copy when both already match). Not here: detecting the layout (`layout.py`), Meta's shards
(`read_meta.py`), building the model (`load.py`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

from ..config import ModelArgs
from .check import check_tensors
from .layout import HF_CONFIG, hf_files
from .names import IGNORED, hf_to_meta, hf_unpermute

_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# a quantised checkpoint (chapter 9, written by `save`) also holds integer codes
_QUANTISED_DTYPES = {"I8": torch.int8, "U8": torch.uint8}


def read_hf(root: Path, args: ModelArgs, expected: dict, device, dtype, progress, tied, codes=None) -> dict:
    files = hf_files(root)
    config = str(root / HF_CONFIG)
    found, stored = {}, {}  # Meta name -> (shape, dtype, where); Meta name -> (file, HF name)
    for file in files:
        with safe_open(file, framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if IGNORED.search(hf_name):
                    continue
                name = hf_to_meta(hf_name)
                where = f"{file.name}: {hf_name!r}"
                if name is None:
                    raise ValueError(f"unexpected tensor {where}: not a Llama parameter name")
                if tied and name == "output.weight":
                    continue  # tied: the head is the embedding
                sl = f.get_slice(hf_name)
                found[name] = (
                    tuple(sl.get_shape()),
                    {**_SAFETENSORS_DTYPES, **_QUANTISED_DTYPES}.get(sl.get_dtype(), sl.get_dtype()),
                    where,
                )
                stored[name] = (file, hf_name)
    check_tensors(found, expected, args, config, hf=True, tied=tied, codes=codes)
    dtype = dtype or found["tok_embeddings.weight"][1]
    state = {}
    for name, (file, hf_name) in tqdm(
        stored.items(), desc="loading tensors", unit="tensor", disable=not progress
    ):
        # one short-lived mapping per tensor: what a conversion (dtype, device, q/k order) leaves behind is
        # unmapped at once, instead of the whole file staying resident until the end
        with safe_open(file, framework="pt") as f:
            w = f.get_tensor(hf_name)  # a view of the memory-mapped file: nothing is read yet
        if ".attention.wq." in name:  # the weight (and a quantised one's scales and zeros: rows too)
            w = hf_unpermute(w, args.n_heads)
        elif ".attention.wk." in name:
            w = hf_unpermute(w, args.n_kv_heads)
        # no copy when dtype and device already match; integer codes keep their dtype
        state[name] = w.to(device=device, dtype=dtype if w.is_floating_point() else None)
    return state
