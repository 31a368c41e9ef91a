"""Loading a checkpoint straight into a tensor-parallel model, each rank reading only its slices (chapter 11).

The model is built on the `meta` device (no storage), made parallel there (`minillama.distributed`),
then each rank allocates only its own shards and fills them from the checkpoint. No rank ever holds
the whole model, which is the point for the 70B (141 GB in bf16) and the 405B.

- Meta's layout: `consolidated.00.pth .. consolidated.{S-1}.pth` are fairscale model-parallel shards,
  cut along the same dims as `distributed.tp_plan` cuts (column-parallel and the vocabulary-parallel
  embedding along dim 0, row-parallel along dim 1, norms replicated: meta-llama/llama-models
  `models/llama3/model.py`, see `read_meta.py`). At degree N == S, rank r's slice of every
  tensor is exactly shard r, so rank r memory-maps `consolidated.r.pth` and no other file. At other
  degrees the loader reshards: rank r's rows [r·G/N, (r+1)·G/N) are copied from whichever source
  shards overlap them (memory-mapped, so only those pages are read).
- Hugging Face's layout: safetensors slices (`get_slice`) read just the rank's rows or columns; the
  q/k rows are un-permuted per head, which works on a rank's slice because it holds whole heads;
- a GGUF file: each tensor is dequantised whole, then the rank's slice is kept (small models only).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from safetensors import safe_open

from ..distributed import check_degree, local_range, parallelize, shard_dim
from ..model import Transformer
from .configs import load_args
from .layout import HF_CONFIG, detect_layout, hf_files, meta_shards, read_json
from .load import _resolve_dtype
from .names import IGNORED, hf_to_meta, hf_unpermute
from .read_gguf import dequantize as gguf_dequantize
from .read_gguf import gguf_default_dtype, gguf_to_meta


class _MetaShards:
    """Reads rank slices from Meta's model-parallel shards, opening (memory-mapping) a shard only
    when a slice needs it. `opened` lists the files this rank touched."""

    def __init__(self, root: Path):
        self.paths = meta_shards(root)
        names = [p.name for p in self.paths]
        if names != [f"consolidated.{i:02d}.pth" for i in range(len(self.paths))]:
            raise ValueError(
                f"{root}: model-parallel shards must be consolidated.00.pth .. consolidated.NN.pth; found {names}"
            )
        self.shards: dict[int, dict] = {}

    @property
    def opened(self) -> list[str]:
        return [self.paths[i].name for i in sorted(self.shards)]

    def _shard(self, i: int) -> dict:
        if i not in self.shards:
            try:  # mmap: nothing is read until a slice is copied; weights_only: no pickled code runs
                self.shards[i] = torch.load(self.paths[i], map_location="cpu", mmap=True, weights_only=True)
            except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as error:
                raise ValueError(
                    f"{self.paths[i]} could not be read as a PyTorch state dict: {error}"
                ) from None
        return self.shards[i]

    def read(self, name: str, dim: int | None, out: torch.Tensor, start: int, rank: int, degree: int) -> None:
        n_src = len(self.paths)
        if dim is None:  # replicated: the copy in the shard this rank reads anyway
            out.copy_(self._get(rank * n_src // degree, name, tuple(out.shape)))
            return
        piece = self.shapes[name][dim] // n_src  # fairscale cuts every tensor evenly
        end = start + out.shape[dim]
        for s in range(start // piece, -(-end // piece)):
            src = self._get(s, name, None)
            lo, hi = max(start, s * piece), min(end, (s + 1) * piece)
            out.narrow(dim, lo - start, hi - lo).copy_(src.narrow(dim, lo - s * piece, hi - lo))

    def _get(self, i: int, name: str, shape) -> torch.Tensor:
        shard = self._shard(i)
        if name not in shard:
            raise ValueError(f"missing tensor {name!r} in {self.paths[i].name}")
        if shape is not None and tuple(shard[name].shape) != shape:
            raise ValueError(
                f"shape mismatch for {name!r} ({self.paths[i].name}): expected {shape}, found {tuple(shard[name].shape)}"
            )
        return shard[name]

    def global_shapes(self, rank: int, degree: int) -> dict[str, tuple]:
        """Every tensor's full shape, from the one shard this rank opens first (the others are alike)."""
        n_src = len(self.paths)
        shard = self._shard(rank * n_src // degree)
        shapes = {}
        for name, t in shard.items():
            if IGNORED.search(name):
                continue
            shape, dim = list(t.shape), shard_dim(name)
            if dim is not None:
                shape[dim] *= n_src
            shapes[name] = tuple(shape)
        self.shapes = shapes
        return shapes

    def dtype(self) -> torch.dtype:
        return self.shards[min(self.shards)]["tok_embeddings.weight"].dtype


class _HFSlices:
    """Reads rank slices from Hugging Face safetensors without reading the rest of any tensor."""

    def __init__(self, root: Path, args):
        self.args = args
        self.where: dict[str, tuple[Path, str]] = {}
        for file in hf_files(root):
            with safe_open(file, framework="pt") as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    name = None if IGNORED.search(hf_name) else hf_to_meta(hf_name)
                    if name is not None:
                        self.where[name] = (file, hf_name)
        self.tied = bool(read_json(root / HF_CONFIG).get("tie_word_embeddings", False))
        if self.tied:
            self.where["output.weight"] = self.where["tok_embeddings.weight"]
        self.opened = sorted({f.name for f, _ in self.where.values()})

    def global_shapes(self, rank: int, degree: int) -> dict[str, tuple]:
        shapes = {}
        for name, (file, hf_name) in self.where.items():
            with safe_open(file, framework="pt") as f:
                shapes[name] = tuple(f.get_slice(hf_name).get_shape())
        return shapes

    def dtype(self) -> torch.dtype:
        file, hf_name = self.where["tok_embeddings.weight"]
        with safe_open(file, framework="pt") as f:
            return f.get_slice(hf_name)[:1].dtype

    def read(self, name: str, dim: int | None, out: torch.Tensor, start: int, rank: int, degree: int) -> None:
        file, hf_name = self.where[name]
        n = out.shape[dim] if dim is not None else None
        with safe_open(file, framework="pt") as f:
            sl = f.get_slice(hf_name)
            w = sl[:] if dim is None else sl[start : start + n] if dim == 0 else sl[:, start : start + n]
        if name.endswith("attention.wq.weight"):  # a rank's rows are whole heads: un-permute them alone
            w = hf_unpermute(w, self.args.n_heads // degree)
        elif name.endswith("attention.wk.weight"):
            w = hf_unpermute(w, self.args.n_kv_heads // degree)
        out.copy_(w)


class _GGUFTensors:
    """Reads rank slices from a GGUF file: a quantised tensor is dequantised whole (its blocks run along
    rows), then the rank's rows or columns are copied. Meant for small models (SmolLM2); the file stays
    memory-mapped, so only the tensors' own pages are read."""

    def __init__(self, path: Path):
        from .read_gguf import ROPE_FREQS, open_gguf

        self.reader = open_gguf(path)
        self.where = {gguf_to_meta(t.name): t for t in self.reader.tensors if t.name != ROPE_FREQS}
        self.where.pop(None, None)
        if "output.weight" not in self.where:  # tied head
            self.where["output.weight"] = self.where["tok_embeddings.weight"]
        self.opened = [path.name]

    def global_shapes(self, rank: int, degree: int) -> dict[str, tuple]:
        return {name: tuple(int(n) for n in reversed(t.shape)) for name, t in self.where.items()}

    def dtype(self) -> torch.dtype:
        return gguf_default_dtype(self.reader)

    def read(self, name: str, dim: int | None, out: torch.Tensor, start: int, rank: int, degree: int) -> None:
        w = gguf_dequantize(self.where[name])
        out.copy_(w if dim is None else w.narrow(dim, start, out.shape[dim]))


def load_parallel(
    path: str | os.PathLike,
    mesh,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    max_seq_len: int | None = None,
) -> Transformer:
    """A tensor-parallel `Transformer` over the 1-D `mesh` with the weights of the checkpoint at `path`
    (Meta, Hugging Face or GGUF), each rank reading only its own slices. Call it on every rank.
    `device` defaults to the mesh's device type (`cuda:LOCAL_RANK` once `torch.cuda.set_device` ran);
    `dtype` None keeps the checkpoint's (bf16 for Meta's releases). The files read are listed in
    `model.loaded_from` (for Meta's layout at degree == shards: just this rank's own shard)."""
    layout, root = detect_layout(path)
    args = load_args(root)
    if max_seq_len is not None:
        args = args.replace(max_seq_len=max_seq_len)
    degree, rank = mesh.size(), mesh.get_local_rank()
    check_degree(args, degree)
    if layout == "gguf":
        reader = _GGUFTensors(root)
    else:
        reader = _HFSlices(root, args) if layout == "hf" else _MetaShards(root)
    shapes = reader.global_shapes(rank, degree)
    with torch.device("meta"):
        model = Transformer(args)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name, shape in expected.items():
        if name not in shapes:
            raise ValueError(f"missing tensor {name!r} in {root} (the model of its config needs it)")
        if shapes[name] != shape:
            raise ValueError(
                f"shape mismatch for {name!r} in {root}: expected {shape} from the config, found {shapes[name]}"
            )
    dtype = _resolve_dtype(dtype) or reader.dtype()
    device = torch.device(device if device is not None else _mesh_device(mesh))
    parallelize(model.to(dtype), mesh)  # still on meta: the DTensors know their layout, hold nothing
    model.to_empty(device=device)  # each rank allocates its own shards only (and rebuilds the rotary tables)
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            dim = shard_dim(name) if hasattr(p, "to_local") else None
            start = 0 if dim is None else local_range(expected[name][dim], degree, rank)[0]
            reader.read(name, dim, local, start, rank, degree)
    model.loaded_from = reader.opened
    return model.eval()


def _mesh_device(mesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)
