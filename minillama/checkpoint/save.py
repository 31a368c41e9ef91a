"""Saving: a model as a Hugging Face checkpoint (safetensors, HF names, wq/wk permuted) that `load` and
transformers' `LlamaForCausalLM.from_pretrained` both read back (chapter 6).

Not here: loading (`load.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import save_file

from ..model import Transformer
from .configs import hf_config
from .layout import HF_CONFIG, HF_INDEX, HF_WEIGHTS
from .names import hf_permute, meta_to_hf


def save(model: Transformer, path: str | os.PathLike, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write `model` as a Hugging Face checkpoint: `config.json` in transformers 4.x keys and safetensors
    weights with HF names and permuted wq/wk, sharded above `max_shard_bytes`. `load` reads it back, and so
    does transformers' `LlamaForCausalLM.from_pretrained`. Returns the folder."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"cannot save into {path}: it is a file, not a folder")
    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("model-*-of-*.safetensors"), path / HF_WEIGHTS, path / HF_INDEX]:
        stale.unlink(missing_ok=True)
    args = model.args
    quantization = getattr(model, "quantization", None)
    if quantization and quantization["backend"] != "minillama":
        raise ValueError(
            f"save writes minillama's quantised layers, not {quantization['backend']}'s tensors; "
            f"quantise with backend='minillama' to save (or save the 16-bit model and quantise after loading)"
        )
    tied = model.output.weight is model.tok_embeddings.weight
    dtype = model.tok_embeddings.weight.dtype  # the head's may be quantised codes
    tensors = {}
    for name, w in model.state_dict().items():
        if tied and name == "output.weight":
            continue
        w = w.detach().to("cpu")
        if ".attention.wq." in name:  # a quantised layer's scales and zeros follow its rows
            w = hf_permute(w, args.n_heads)
        elif ".attention.wk." in name:
            w = hf_permute(w, args.n_kv_heads)
        tensors[meta_to_hf(name)] = w.contiguous()
    shards, size = [[]], 0
    for name, w in tensors.items():
        nbytes = w.numel() * w.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(tensors, path / HF_WEIGHTS, metadata=metadata)
    else:
        weight_map = {}
        for i, names in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file({n: tensors[n] for n in names}, path / file, metadata=metadata)
            weight_map.update(dict.fromkeys(names, file))
        total = sum(w.numel() * w.element_size() for w in tensors.values())
        with open(path / HF_INDEX, "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config = hf_config(args, dtype, tied)
    if quantization:
        config["minillama"]["quantization"] = quantization
    with open(path / HF_CONFIG, "w") as f:
        json.dump(config, f, indent=2)
    return path
