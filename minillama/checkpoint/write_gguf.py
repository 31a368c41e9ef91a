"""Writing a model as a GGUF file that llama.cpp runs and `load` reads back (chapters 7 and 9).

The inverse of `read_gguf.py`, with the `gguf` package's `GGUFWriter` and quantisers (ggml-org/llama.cpp
`gguf-py`): the `llama.*` metadata from `model.args`, the weights under llama.cpp's names in Meta's q/k
order (no permutation, as llama.cpp's own converter stores them), Llama 3.1's RoPE scaling as the
`rope_freqs` divisors, and the tokenizer and chat template copied from a GGUF that has them (llama.cpp
needs a vocabulary to run a file). Every matrix is stored in one ggml type, so the same weights can be
handed to llama.cpp and to minillama in each format:

  F32, F16, BF16   the weights as they are, or rounded to 16 bits
  Q8_0             blocks of 32 weights of a row: int8 codes q = round(w / d), d = max|w| / 127 (one f16
                   scale per block: 8.5 bits per weight)
  Q4_0             blocks of 32: 4-bit codes, w ≈ (q - 8) · d, d = the block's largest-magnitude weight / -8
                   (4.5 bits per weight)
  Q4_1             blocks of 32: 4-bit codes, w ≈ q · d + m, d = (max - min) / 15, m = min (f16 d and m: 5 bits
                   per weight)

The norms (1-D) stay F32, as llama.cpp keeps them. A tied head (SmolLM2, Llama 3.2 1B/3B) is stored once, as
`token_embd.weight`, which llama.cpp then also uses as its output matrix. Not here: reading (`read_gguf.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..model import Transformer
from ..rope import inv_freq
from .read_gguf import GGUF_BLOCK, GGUF_TOP, ROPE_FREQS, open_gguf

GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")  # what `gguf.quants` 0.19 can write
BLOCK = 32  # weights per Q8_0 / Q4_0 / Q4_1 block: a row's length must be a multiple
# the metadata copied from the `tokenizer` file: its vocabulary and chat template, and what it is called
COPIED = ("tokenizer.", "general.name", "general.basename", "general.organization", "general.finetune",
          "general.size_label", "general.license")  # fmt: skip
_META_TO_GGUF = {f"{meta}.weight": f"{gguf}.weight" for gguf, meta in GGUF_TOP.items()}
_BLOCK_TO_GGUF = {meta: gguf for gguf, meta in GGUF_BLOCK.items()}


def meta_to_gguf(name: str) -> str:
    """llama.cpp's name for a Meta parameter name: `layers.3.attention.wq.weight` -> `blk.3.attn_q.weight`."""
    if name in _META_TO_GGUF:
        return _META_TO_GGUF[name]
    _, layer, rest = name.split(".", 2)
    return f"blk.{layer}.{_BLOCK_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def _file_type(kind: str) -> int:
    from gguf import LlamaFileType

    return {"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16,
            "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_0": LlamaFileType.MOSTLY_Q4_0,
            "Q4_1": LlamaFileType.MOSTLY_Q4_1}[kind]  # fmt: skip


def _check(model: Transformer, kind: str, tokenizer) -> dict:
    if kind not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {kind!r}; save_gguf writes one of {GGUF_TYPES}")
    if getattr(model, "quantization", None):
        raise ValueError(
            f"save_gguf writes float weights and quantises them itself; this model is already quantised "
            f"({model.quantization}): save the 16- or 32-bit model (ml.load it again) with type='Q8_0' etc."
        )
    tied = model.output.weight is model.tok_embeddings.weight
    weights = {n: w for n, w in model.state_dict().items() if not (tied and n == "output.weight")}
    if kind.startswith("Q"):
        for name, w in weights.items():
            if w.dim() == 2 and w.shape[1] % BLOCK:
                raise ValueError(
                    f"{name} has rows of {w.shape[1]} weights; {kind} stores blocks of {BLOCK}, so every row "
                    f"length must be a multiple of {BLOCK}: save it as F32, F16 or BF16"
                )
    if tokenizer is not None:
        tokens = open_gguf(tokenizer).fields.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError(f"{tokenizer} holds no tokenizer (no tokenizer.ggml.tokens): pass a GGUF that has one")
        vocab = len(tokens.data)  # one entry per token
        if vocab != model.args.vocab_size:
            raise ValueError(
                f"{tokenizer} has {vocab:,} tokens but the model's vocabulary is {model.args.vocab_size:,}: "
                f"pass the GGUF the model was loaded from (or one with the same vocabulary)"
            )
    return weights


def _tensor(w: torch.Tensor, kind: str):
    """(array, ggml type or None) for `GGUFWriter.add_tensor`: 1-D tensors as F32, matrices as `kind`."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    a = w.detach().to("cpu", torch.float32).numpy()
    if a.ndim == 1 or kind == "F32":
        return a, None
    if kind == "F16":
        return a.astype(np.float16), None
    qtype = GGMLQuantizationType[kind]
    return quantize(a, qtype), qtype  # uint8 blocks; the writer derives the shape in weights


def save_gguf(
    model: Transformer, path: str | os.PathLike, type: str = "F32", tokenizer: str | os.PathLike | None = None
) -> Path:
    """Write `model` as one GGUF file at `path`, every matrix as `type` (one of `GGUF_TYPES`; the norms F32),
    with the tokenizer and chat template of the GGUF file `tokenizer` (e.g. the file the model was loaded
    from; llama.cpp runs a file only with its vocabulary). `load` reads the file back; quantised types come
    back dequantised to float32. Returns the path."""
    from gguf import GGML_QUANT_VERSION, GGUFValueType, GGUFWriter

    weights = _check(model, type, tokenizer)
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    args = model.args
    writer = GGUFWriter(path, "llama")
    if tokenizer is not None:
        for key, f in open_gguf(tokenizer).fields.items():
            if key.startswith(COPIED):
                sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
                writer.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    writer.add_context_length(args.max_seq_len)
    writer.add_embedding_length(args.dim)
    writer.add_block_count(args.n_layers)
    writer.add_feed_forward_length(args.ffn_hidden_dim)
    writer.add_head_count(args.n_heads)
    writer.add_head_count_kv(args.n_kv_heads)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    writer.add_file_type(_file_type(type))
    writer.add_quantization_version(GGML_QUANT_VERSION)
    if args.use_scaled_rope:  # llama.cpp divides pair p's frequency by rope_freqs[p] (PR #8676)
        writer.add_rope_scaling_orig_ctx_len(args.rope_original_max_seq_len)
        divisors = inv_freq(args.replace(use_scaled_rope=False)) / inv_freq(args)
        writer.add_tensor(ROPE_FREQS, divisors.float().numpy())
    for name, w in weights.items():
        array, qtype = _tensor(w, type)
        writer.add_tensor(meta_to_gguf(name), array, raw_dtype=qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path
