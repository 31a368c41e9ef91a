"""Config translation: Hugging Face's `config.json` and Meta's `params.json` <-> `ModelArgs` (chapter 6).

An explicit FFN width (HF's `intermediate_size`) is expressed as Meta's rounding rule when one gives the
same width, so the published 8B config reads back as the catalogue's 8B. Not here: finding the files
(`layout.py`) or the weights (`read_hf.py`, `read_meta.py`).
"""

from __future__ import annotations

import os

import torch

from ..config import MODELS, ModelArgs
from .layout import HF_CONFIG, META_PARAMS, detect_layout, read_json


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


def _from_catalogue(args: ModelArgs) -> ModelArgs:
    """Meta's params.json names neither the RoPE scale factor nor a tied head: a shape of the catalogue
    (Llama 3.2 1B/3B: factor 32, tied) takes both from there; any other shape keeps factor 8, untied."""
    for known in MODELS.values():
        fields = {"name": args.name, "rope_scale_factor": args.rope_scale_factor, "tie_embeddings": False}
        if known.replace(**fields) == args.replace(tie_embeddings=False):
            return args.replace(
                name=known.name,
                rope_scale_factor=known.rope_scale_factor,
                tie_embeddings=known.tie_embeddings,
            )
    return args.replace(name="custom")


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
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),  # transformers' default: untied
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
    return _from_catalogue(ModelArgs(**fields))


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.bfloat16, tied: bool | None = None) -> dict:
    """A transformers 4.x-style `config.json` (the published Llama 3.1 layout) for `args`; `tied` None:
    `args.tie_embeddings`."""
    tied = args.tie_embeddings if tied is None else tied
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


def load_args(path: str | os.PathLike) -> ModelArgs:
    """The ModelArgs of a checkpoint, from its config alone (no weights are read)."""
    layout, root = detect_layout(path)
    if layout == "gguf":
        from .read_gguf import args_from_gguf, open_gguf

        return args_from_gguf(open_gguf(root), root)
    if layout == "hf":
        return args_from_hf_config(read_json(root / HF_CONFIG), str(root / HF_CONFIG))
    return args_from_meta_params(read_json(root / META_PARAMS), str(root / META_PARAMS))
