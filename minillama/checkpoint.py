"""Load Meta and Hugging Face checkpoints of Llama 3.1; save safetensors (chapter 6).

Two layouts hold the same weights:

- Meta's: `params.json` (ModelArgs field names) and `consolidated.00.pth` ... `consolidated.NN.pth`, one file
  per model-parallel rank. Parameter names are this package's (`layers.0.attention.wq.weight`). A tensor split
  across ranks is cut along the dim its fairscale layer divides (meta-llama/llama-models
  `models/llama3/model.py`, as in the `llama-models==0.3.0` wheel): `ColumnParallelLinear` (wq, wk, wv
  118-138, w1 and w3 220-222, output 271) splits the output features, dim 0; `RowParallelLinear` (wo
  139-145, w2 221) the input features, dim 1; `VocabParallelEmbedding` (tok_embeddings, 264) the
  vocabulary, dim 0 (Llama 2's `ParallelEmbedding` split the width, dim 1: recognised from the shapes);
  the norms are replicated. Meta's own resharder, `models/checkpoint.py` 71-155 (`reshard_mp`), merges
  along the same dims.
- Hugging Face's: `config.json` and `model.safetensors`, or shards `model-0000N-of-0000M.safetensors`
  listed in `model.safetensors.index.json`. Names differ (`model.layers.0.self_attn.q_proj.weight`), and
  wq, wk are stored permuted: HF rotates channel p with channel p + hd/2 instead of Meta's interleaved
  pair (2p, 2p+1), so its converter reorders each head's rows (huggingface/transformers v4.46.3,
  `src/transformers/models/llama/convert_llama_weights_to_hf.py` 221-223, `permute`; `minillama.sources`
  key "hf-permute"). `load` applies the inverse, so one attention code path serves both layouts.
  Hugging Face's model repositories also ship Meta's files under `original/`; `load` reads those when
  the top level holds no Hugging Face weights.

Loading is memory-lean: the model is built on the `meta` device (no storage), each tensor is read from a
memory-mapped file straight to the target device and dtype (no copy at all when both already match), and
`load_state_dict(assign=True)` adopts the tensors; model-parallel shards are merged one shard at a time.
`benchmarks/load_memory.py` measures peak RSS against the file size. Every name, shape and dtype is checked before any
weight is read, so a bad checkpoint fails in milliseconds with the name of the tensor at fault.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import torch
from einops import rearrange
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

from .config import MODELS, ModelArgs
from .model import Transformer

META_PARAMS = "params.json"
HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
ORIGINAL = "original"  # where Hugging Face repositories keep Meta's files
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# a quantised checkpoint (chapter 9, written by `save`) also holds integer codes, and scales and zeros
_QUANTISED_DTYPES = {"I8": torch.int8, "U8": torch.uint8}
_QUANTISED_PARTS = ("weight", "scales", "zeros")

# Hugging Face parameter names -> Meta's (a block's parameters, then the rest)
_HF_BLOCK = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
_HF_TOP = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}
_META_BLOCK = {meta: hf for hf, meta in _HF_BLOCK.items()}
_META_TOP = {meta: hf for hf, meta in _HF_TOP.items()}
_HF_BLOCK_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|scales|zeros)")
_LAYER_RE = re.compile(r"layers\.(\d+)\.")
# derived tensors some checkpoints carry; the model recomputes them
_IGNORED = re.compile(r"(^|\.)(rotary_emb\.inv_freq|rope\.freqs)$")

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


def hf_to_meta(name: str) -> str | None:
    """Meta's name for a Hugging Face parameter name, or None when it is not a Llama weight."""
    if match := _HF_BLOCK_RE.fullmatch(name):
        layer, part, kind = match.groups()
        return f"layers.{layer}.{_HF_BLOCK[part]}.{kind}" if part in _HF_BLOCK else None
    base, _, kind = name.rpartition(".")
    return f"{_HF_TOP[base]}.{kind}" if base in _HF_TOP and kind in _QUANTISED_PARTS else None


def meta_to_hf(name: str) -> str:
    """Hugging Face's name for a Meta parameter name."""
    if match := re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|scales|zeros)", name):
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_META_BLOCK[part]}.{kind}"
    base, _, kind = name.rpartition(".")
    return f"{_META_TOP[base]}.{kind}"


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved rotary rows -> Hugging Face's half-split rows, per head: row (2p + i) of a head
    moves to row (i · hd/2 + p). The same reordering as transformers' `permute` (see the module docstring)."""
    return rearrange(w, "(h p two) ... -> (h two p) ...", h=n_heads, two=2).contiguous()


def hf_unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `hf_permute`: Hugging Face's q_proj/k_proj rows back to Meta's interleaved pairs."""
    return rearrange(w, "(h two p) ... -> (h p two) ...", h=n_heads, two=2).contiguous()


# ----------------------------------------------------------------------------------------------------------
# configs


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None


def _normalise_ffn(args: ModelArgs, rules: list[tuple[int, float | None]]) -> ModelArgs:
    """Express an explicit FFN width (HF's intermediate_size) as Meta's rounding rule (multiple_of,
    ffn_dim_multiplier) when one of `rules` gives the same width, so the published 8B config.json
    reads back as the catalogue's 8B; otherwise keep it as `hidden_dim`."""
    for multiple_of, multiplier in rules:
        candidate = args.replace(hidden_dim=None, multiple_of=multiple_of, ffn_dim_multiplier=multiplier)
        if candidate.ffn_hidden_dim == args.hidden_dim:
            return candidate
    return args


def _catalogue_name(args: ModelArgs, default: str) -> str:
    for known in MODELS.values():
        if known.replace(name=args.name) == args:
            return known.name
    return default


def args_from_hf_config(config: dict, source: str = HF_CONFIG) -> ModelArgs:
    """ModelArgs from a Hugging Face Llama `config.json` (transformers 4.x or 5.x keys)."""

    def need(key):
        if key not in config:
            raise ValueError(f"{source}: missing key {key!r}; a Llama config.json names it")
        return config[key]

    model_type = config.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(
            f"{source}: model_type is {model_type!r}; minillama loads Llama checkpoints ('llama')"
        )
    for key, supported in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if config.get(key, supported) != supported:
            raise ValueError(
                f"{source}: {key}={config[key]!r} is not supported (Llama 3.1 uses {supported!r})"
            )
    dim, n_heads = need("hidden_size"), need("num_attention_heads")
    if config.get("head_dim") not in (None, dim // n_heads):
        raise ValueError(
            f"{source}: head_dim={config['head_dim']} differs from hidden_size // num_attention_heads = "
            f"{dim // n_heads}; minillama derives the head width from dim and n_heads"
        )
    # transformers 5.x: rope_parameters holds rope_theta and the scaling; 4.x: rope_theta + rope_scaling
    rope = config.get("rope_parameters") or {}
    scaling = rope if "rope_parameters" in config else (config.get("rope_scaling") or {})
    theta = rope.get("rope_theta", config.get("rope_theta", 10_000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("llama3", "default"):
        raise ValueError(
            f"{source}: rope_type {rope_type!r} is not supported; minillama implements Llama 3.1's 'llama3' "
            f"scaling and unscaled RoPE ('default')"
        )
    scaled = {}
    if rope_type == "llama3":
        scaled = {
            "rope_scale_factor": float(scaling["factor"]),
            "rope_low_freq_factor": float(scaling["low_freq_factor"]),
            "rope_high_freq_factor": float(scaling["high_freq_factor"]),
            "rope_original_max_seq_len": int(scaling["original_max_position_embeddings"]),
        }
    extra = config.get("minillama", {})  # what `save` adds so that Meta's FFN rule and the name survive
    args = ModelArgs(
        dim=dim,
        n_layers=need("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        vocab_size=need("vocab_size"),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        use_scaled_rope=rope_type == "llama3",
        max_seq_len=int(config.get("max_position_embeddings", 131_072)),
        hidden_dim=need("intermediate_size"),
        **scaled,
    )
    rules = [
        (known.multiple_of, known.ffn_dim_multiplier) for known in MODELS.values() if known.dim == args.dim
    ]
    if "multiple_of" in extra:
        rules.insert(0, (extra["multiple_of"], extra.get("ffn_dim_multiplier")))
    args = _normalise_ffn(args, rules)
    return args.replace(name=extra.get("name") or _catalogue_name(args, "custom"))


def args_from_meta_params(params: dict, source: str = META_PARAMS) -> ModelArgs:
    """ModelArgs from Meta's `params.json` (the same field names; Llama 3.1 adds `use_scaled_rope`)."""
    known = {
        "dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "vocab_size",
        "multiple_of",
        "ffn_dim_multiplier",
        "norm_eps",
        "rope_theta",
        "use_scaled_rope",
        "max_seq_len",
    }
    for key in ("dim", "n_layers", "n_heads", "vocab_size"):
        if key not in params:
            raise ValueError(f"{source}: missing key {key!r}; Meta's params.json names it")
    fields = {k: v for k, v in params.items() if k in known and v is not None}
    fields.setdefault("n_kv_heads", params["n_heads"])
    fields.setdefault("use_scaled_rope", False)
    fields.setdefault("ffn_dim_multiplier", None)
    fields.setdefault("multiple_of", 256)  # Meta's ModelArgs default
    # Llama 3.1 (scaled RoPE) reads 128K positions; Llama 3 was trained at 8K
    fields.setdefault("max_seq_len", 131_072 if fields["use_scaled_rope"] else 8192)
    args = ModelArgs(**fields)
    return args.replace(name=_catalogue_name(args, "custom"))


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.bfloat16, tied: bool = False) -> dict:
    """A transformers 4.x-style `config.json` (the published Llama 3.1 layout) for `args`."""
    rope_scaling = None
    if args.use_scaled_rope:
        rope_scaling = {
            "factor": args.rope_scale_factor,
            "low_freq_factor": args.rope_low_freq_factor,
            "high_freq_factor": args.rope_high_freq_factor,
            "original_max_position_embeddings": args.rope_original_max_seq_len,
            "rope_type": "llama3",
        }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "max_position_embeddings": args.max_seq_len,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": args.n_heads,
        "num_hidden_layers": args.n_layers,
        "num_key_value_heads": args.n_kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": args.norm_eps,
        "rope_scaling": rope_scaling,
        "rope_theta": args.rope_theta,
        "tie_word_embeddings": tied,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "use_cache": True,
        "vocab_size": args.vocab_size,
        "minillama": {
            "name": args.name,
            "multiple_of": args.multiple_of,
            "ffn_dim_multiplier": args.ffn_dim_multiplier,
        },
    }
    if args.vocab_size == 128_256:  # the Llama 3 vocabulary: <|begin_of_text|>, <|end_of_text|>
        config.update(bos_token_id=128_000, eos_token_id=128_001)
    return config


# ----------------------------------------------------------------------------------------------------------
# finding the files


def _listing(root: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} entries)" if len(names) > 20 else "")
    return shown or "nothing (the folder is empty)"


def _meta_shards(root: Path) -> list[Path]:
    return sorted(root.glob("consolidated.*.pth"))


def _hf_files(root: Path) -> list[Path] | None:
    """The safetensors files of a Hugging Face checkpoint in `root`, or None when there are none."""
    if (root / HF_INDEX).is_file():
        weight_map = _read_json(root / HF_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{root / HF_INDEX} has no 'weight_map' from tensor names to files")
        files = sorted({root / name for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(
                    f"{file} is listed in {HF_INDEX} but does not exist; the download is incomplete"
                )
        return files
    if (root / HF_WEIGHTS).is_file():
        return [root / HF_WEIGHTS]
    shards = sorted(root.glob("model-*-of-*.safetensors"))
    return shards or None


def detect_layout(path: str | os.PathLike) -> tuple[str, Path]:
    """("hf" or "meta", the folder holding the files) for a checkpoint folder (or a file in it)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    root = path if path.is_dir() else path.parent
    if (root / HF_CONFIG).is_file() and _hf_files(root):
        return "hf", root
    for folder in (root, root / ORIGINAL):
        if (folder / META_PARAMS).is_file() and _meta_shards(folder):
            return "meta", folder
    hint = ""
    names = {p.name for p in root.iterdir()}
    if any(n.endswith(".bin") for n in names):
        hint = " PyTorch .bin weights are not read (they unpickle code); convert them to safetensors."
    elif any(n.endswith(".gguf") for n in names):
        hint = " GGUF files (llama.cpp) are not read."
    elif (root / HF_CONFIG).is_file():
        hint = f" {HF_CONFIG} is there but no {HF_WEIGHTS}, {HF_INDEX} or model-*-of-*.safetensors."
    elif (root / META_PARAMS).is_file():
        hint = f" {META_PARAMS} is there but no consolidated.*.pth."
    raise ValueError(
        f"{root} is not a checkpoint minillama knows. Found: {_listing(root)}. Expected Hugging Face "
        f"({HF_CONFIG} + {HF_WEIGHTS} or sharded model-0000N-of-0000M.safetensors + {HF_INDEX}) or Meta "
        f"({META_PARAMS} + consolidated.00.pth), possibly under {ORIGINAL}/.{hint}"
    )


def load_args(path: str | os.PathLike) -> ModelArgs:
    """The ModelArgs of a checkpoint, from its config alone (no weights are read)."""
    layout, root = detect_layout(path)
    if layout == "hf":
        return args_from_hf_config(_read_json(root / HF_CONFIG), str(root / HF_CONFIG))
    return args_from_meta_params(_read_json(root / META_PARAMS), str(root / META_PARAMS))


# ----------------------------------------------------------------------------------------------------------
# loading


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


def _describe(args: ModelArgs) -> str:
    return (
        f"dim={args.dim}, n_layers={args.n_layers}, n_heads={args.n_heads}, n_kv_heads={args.n_kv_heads}, "
        f"vocab_size={args.vocab_size}, ffn width={args.ffn_hidden_dim}"
    )


def _check(found: dict, expected: dict, args: ModelArgs, config: str, hf: bool, tied: bool, codes=None) -> None:
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


def _load_hf(root: Path, args: ModelArgs, expected: dict, device, dtype, progress, tied, codes=None) -> dict:
    files = _hf_files(root)
    config = str(root / HF_CONFIG)
    found, stored = {}, {}  # Meta name -> (shape, dtype, where); Meta name -> (file, HF name)
    for file in files:
        with safe_open(file, framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if _IGNORED.search(hf_name):
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
    _check(found, expected, args, config, hf=True, tied=tied, codes=codes)
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


def _load_meta(root: Path, args: ModelArgs, expected: dict, device, dtype, progress) -> dict:
    config = str(root / META_PARAMS)
    paths = _meta_shards(root)
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
        if _IGNORED.search(name):
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
    _check(found, expected, args, config, hf=False, tied=False)
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
        tied = bool(_read_json(root / HF_CONFIG).get("tie_word_embeddings", False))
    with torch.device("meta"):
        model = Transformer(args)
    quantization = _read_json(root / HF_CONFIG).get("minillama", {}).get("quantization") if layout == "hf" else None
    if quantization:  # written by `save` from a quantised model (chapter 9): the same layers, empty
        from .quantize import quantized_like

        quantized_like(model, quantization)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    codes = {name: t.dtype for name, t in model.state_dict().items() if not t.is_floating_point()}
    if layout == "hf":
        state = _load_hf(root, args, expected, device, dtype, progress, tied, codes)
    else:
        state = _load_meta(root, args, expected, device, dtype, progress)
    if tied:
        state["output.weight"] = state["tok_embeddings.weight"]
    model.load_state_dict(state, assign=True, strict=True)
    if tied:
        model.output.weight = model.tok_embeddings.weight
    # the rotary tables are derived, not stored: .to(device) rebuilds them there (see RotaryEmbedding._apply)
    return model.to(device).eval()


# ----------------------------------------------------------------------------------------------------------
# saving


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
