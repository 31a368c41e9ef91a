"""Reading Meta's checkpoint: `consolidated.NN.pth`, one file per model-parallel rank, merged (chapter 6).

A tensor split across ranks is cut along the dim its fairscale layer divides (meta-llama/llama-models
`models/llama3/model.py`, as in the `llama-models==0.3.0` wheel): `ColumnParallelLinear` (wq, wk, wv
118-138, w1 and w3 220-222, output 271) splits the output features, dim 0; `RowParallelLinear` (wo
139-145, w2 221) the input features, dim 1; `VocabParallelEmbedding` (tok_embeddings, 264) the
vocabulary, dim 0 (Llama 2's `ParallelEmbedding` split the width, dim 1: recognised from the shapes);
the norms are replicated. Meta's own resharder, `models/checkpoint.py` 71-155 (`reshard_mp`), merges
along the same dims. Shards are memory-mapped and merged one at a time, so the peak is the weights plus
one shard. Not here: Hugging Face's layout (`read_hf.py`), building the model (`load.py`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

from ..config import ModelArgs
from .check import check_tensors
from .layout import META_PARAMS, meta_shards
from .names import IGNORED

# Meta model-parallel shards: the dim each fairscale layer splits (None: replicated)
_ROW_PARALLEL = ("attention.wo.weight", "feed_forward.w2.weight")  # input features split: dim 1
_COLUMN_PARALLEL = (
    "attention.wq.weight",
    "attention.wk.weight",
    "attention.wv.weight",
    "feed_forward.w1.weight",
    "feed_forward.w3.weight",
    "output.weight",
)  # output features split: dim 0


def _shard_dim(name: str, pieces: list[tuple], full: tuple) -> int | None:
    """The dim along which Meta's model-parallel ranks split `name` (None: replicated)."""
    if name.endswith(_ROW_PARALLEL):
        return 1
    if name.endswith(_COLUMN_PARALLEL):
        return 0
    if (
        name == "tok_embeddings.weight"
    ):  # VocabParallelEmbedding (Llama 3): dim 0; ParallelEmbedding (Llama 2): dim 1
        return 0 if sum(p[0] for p in pieces) == full[0] and pieces[0][1] == full[1] else 1
    return None


def read_meta(root: Path, args: ModelArgs, expected: dict, device, dtype, progress) -> dict:
    config = str(root / META_PARAMS)
    paths = meta_shards(root)
    names = [p.name for p in paths]
    if names != [f"consolidated.{i:02d}.pth" for i in range(len(paths))]:
        raise ValueError(
            f"{root}: model-parallel shards must be consolidated.00.pth .. consolidated.NN.pth; found {names}"
        )
    # mmap: the files are mapped, not read; weights_only: no pickled code runs
    shards = []
    for path in tqdm(paths, desc="opening shards", unit="shard", disable=not progress or len(paths) == 1):
        try:
            shards.append(torch.load(path, map_location="cpu", mmap=True, weights_only=True))
        except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as error:
            raise ValueError(f"{path} could not be read as a PyTorch state dict: {error}") from None
    first = shards[0]
    for path, shard in zip(paths[1:], shards[1:]):
        if shard.keys() != first.keys():
            odd = sorted(set(shard) ^ set(first))[:3]
            raise ValueError(
                f"{path.name} and {paths[0].name} hold different tensors (e.g. {odd}); the shards do not match"
            )
    found, dims = {}, {}
    for name in first:
        if IGNORED.search(name):
            continue
        pieces = [tuple(s[name].shape) for s in shards]
        where = f"{paths[0].name}: {name!r}" if len(shards) == 1 else f"{len(shards)} shards: {name!r}"
        shape = pieces[0]
        if len(shards) > 1 and name in expected:
            dims[name] = dim = _shard_dim(name, pieces, tuple(expected[name]))
            if dim is not None:
                shape = list(pieces[0])
                shape[dim] = sum(p[dim] for p in pieces)
        found[name] = (tuple(shape), first[name].dtype, where)
    check_tensors(found, expected, args, config, hf=False, tied=False)
    dtype = dtype or found["tok_embeddings.weight"][1]
    if len(shards) == 1:  # views of the mapped file (copied only to change dtype or device)
        return {
            name: first[name].to(device=device, dtype=dtype)
            for name in tqdm(found, desc="loading tensors", unit="tensor", disable=not progress)
        }
    # several shards: allocate each merged tensor once, then fill it shard by shard, releasing each
    # shard's mapping before opening the next, so the peak is the weights plus one shard
    state = {name: torch.empty(found[name][0], dtype=dtype, device=device) for name in found}
    del first, shards
    offsets = dict.fromkeys(found, 0)
    for path in tqdm(paths, desc="merging shards", unit="shard", disable=not progress):
        shard = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        for name, out in state.items():
            piece, dim = shard[name], dims[name]
            if dim is None:
                if offsets[name] == 0:  # replicated (the norms): the first rank's copy
                    out.copy_(piece)
                    offsets[name] = 1
                continue
            out.narrow(dim, offsets[name], piece.shape[dim]).copy_(piece)
            offsets[name] += piece.shape[dim]
        del shard
    return state
