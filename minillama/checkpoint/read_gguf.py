"""Reading a GGUF file (llama.cpp, Ollama, LM Studio): its config, its tensors dequantised (chapter 6).

GGUF is one file: a header of typed key/value metadata (`llama.block_count`, `tokenizer.ggml.tokens`,
...), a table of tensors (name, shape, ggml type, offset) and the tensor data, aligned. It is read with
the `gguf` package (ggml-org/llama.cpp `gguf-py`), whose `GGUFReader` memory-maps the file and whose
`gguf.quants.dequantize` turns the quantised blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) into float32.

- the config comes from the `llama.*` keys (a file whose `general.architecture` is not `llama` is
  refused): width, blocks, heads, KV heads, FFN width, RMSNorm epsilon, RoPE base, context length; the
  vocabulary from the token list; no `output.weight` tensor means a tied head. Llama 3.1 files carry
  the RoPE scaling as a `rope_freqs` tensor of per-pair divisors (llama.cpp PR #8676: the model divides
  ω_p by rope_freqs[p]); `args_from_gguf` recovers Llama 3.1's scaling parameters from them and checks
  that minillama's own scaling (`rope.inv_freq`) gives the same divisors;
- names: `blk.N.attn_q.weight` -> `layers.N.attention.wq.weight` and so on (`GGUF_BLOCK` below);
- no q/k permutation: llama.cpp's converter stores wq and wk in Meta's interleaved-pair order (its
  `convert_hf_to_gguf.py` re-permutes Hugging Face's rows back), which is minillama's order. The test
  that shows it compares logits with transformers' own load of the same file (`tests/test_gguf.py`),
  where transformers un-permutes for its half-split rotary pairs.

Not here: building the model (`load.py`), the tokenizer a GGUF holds (`minillama/tokenizer_gguf.py`).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

from ..config import MODELS, ModelArgs
from ..rope import inv_freq
from .check import check_tensors
from .configs import _catalogue_name, _normalise_ffn
from .layout import GGUF_SUFFIX

# ggml tensor types minillama dequantises (the gguf package reads more; these are the ones tested)
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
GGUF_TOP = {"token_embd": "tok_embeddings", "output_norm": "norm", "output": "output"}
GGUF_BLOCK = {
    "attn_q": "attention.wq",
    "attn_k": "attention.wk",
    "attn_v": "attention.wv",
    "attn_output": "attention.wo",
    "ffn_gate": "feed_forward.w1",
    "ffn_down": "feed_forward.w2",
    "ffn_up": "feed_forward.w3",
    "attn_norm": "attention_norm",
    "ffn_norm": "ffn_norm",
}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1's per-pair RoPE divisors, not a parameter
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_to_meta(name: str) -> str | None:
    """Meta's name for a GGUF tensor name, or None when it is not a Llama weight."""
    if match := _BLOCK_RE.fullmatch(name):
        layer, part = match.groups()
        return f"layers.{layer}.{GGUF_BLOCK[part]}.weight" if part in GGUF_BLOCK else None
    base, _, kind = name.rpartition(".")
    return f"{GGUF_TOP[base]}.weight" if base in GGUF_TOP and kind == "weight" else None


def _gguf_reader_class():
    from gguf import GGUFReader

    class Reader(GGUFReader):
        """GGUFReader on a plain ndarray view of its memory map: the header parse slices the map once per
        token and merge (about 400,000 slices for SmolLM2's vocabulary), and numpy's `memmap` subclass
        costs Python-level bookkeeping on each; an ndarray view of the same map reads the same pages
        three times faster here."""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return Reader


@functools.lru_cache(maxsize=2)
def _reader(path: str, size: int, mtime_ns: int):
    # parsing the header (a SmolLM2 file: 49,152 tokens and 48,900 merges as typed fields) takes seconds;
    # `ml.load` and `Tokenizer.default` of the same file share one parse. Keyed by size and mtime, so a
    # rewritten file is parsed again.
    try:
        reader = _gguf_reader_class()(path, "r")  # memory-mapped: tensor data is read only when touched
    except (ValueError, IndexError, KeyError, OSError) as error:
        said = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{path} could not be read as GGUF ({said}): the file is truncated or damaged (or not a GGUF "
            f"file); download it again"
        ) from None
    reader.path = path
    return reader


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` of the file at `path` (cached), with one-line errors for a bad file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    stat = path.stat()
    reader = _reader(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    for t in reader.tensors:  # the reader maps what the file holds; a cut-off file ends inside the data
        if t.data_offset + int(t.n_bytes) > stat.st_size:
            raise ValueError(
                f"{path} is truncated: tensor {t.name!r} ends at byte {t.data_offset + int(t.n_bytes):,} but "
                f"the file has {stat.st_size:,} bytes; download it again"
            )
    return reader


_MISSING = object()


def field(reader, key: str, default=_MISSING):
    """The value of metadata `key` (a number, a string, or a list), or `default`."""
    f = reader.fields.get(key)
    if f is None:
        if default is _MISSING:
            raise ValueError(f"{reader.path}: missing GGUF metadata {key!r}; a llama GGUF names it")
        return default
    return f.contents()


def tensor_type(t) -> str:
    return t.tensor_type.name


def _rope_scaling(reader, args: ModelArgs, path: str) -> ModelArgs:
    """Llama 3.1's scaling from the `rope_freqs` divisors: the factor is the largest divisor, the band
    limits Llama 3.1's (low 1, high 4, original 8,192, or the file's original context length); the
    divisors minillama's own scaling then gives must equal the file's, to float32 rounding."""
    stored = {t.name: t for t in reader.tensors}.get(ROPE_FREQS)
    scaling_type = field(reader, "llama.rope.scaling.type", None)
    if scaling_type not in (None, "none", "linear") or (
        scaling_type == "linear" and field(reader, "llama.rope.scaling.factor", 1.0) != 1.0
    ):
        raise ValueError(
            f"{path}: RoPE scaling {scaling_type!r} is not supported; minillama implements Llama 3.1's scaling "
            f"(a rope_freqs tensor) and unscaled RoPE"
        )
    if stored is None:
        return args.replace(use_scaled_rope=False)
    divisors = torch.from_numpy(np.array(stored.data, dtype=np.float32).reshape(-1))
    if divisors.numel() != args.head_dim // 2:
        raise ValueError(
            f"{path}: rope_freqs holds {divisors.numel()} divisors; head_dim={args.head_dim} has {args.head_dim // 2} pairs"
        )
    original = int(field(reader, "llama.rope.scaling.original_context_length", 8192))
    scaled = args.replace(
        use_scaled_rope=True,
        rope_scale_factor=float(divisors.max()),
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_seq_len=original,
    )
    for known in MODELS.values():  # the catalogue's exact factor (8.0, 32.0), not its float32 rounding
        if known.use_scaled_rope and abs(known.rope_scale_factor - scaled.rope_scale_factor) < 1e-4:
            scaled = scaled.replace(rope_scale_factor=known.rope_scale_factor)
    ours = inv_freq(args.replace(use_scaled_rope=False)) / inv_freq(scaled)
    if not torch.allclose(ours, divisors, rtol=1e-5, atol=0):
        worst = int((ours - divisors).abs().argmax())
        raise ValueError(
            f"{path}: the rope_freqs divisors are not Llama 3.1's scaling (factor {scaled.rope_scale_factor:g}, "
            f"low 1, high 4, original {original}): pair {worst} is {float(divisors[worst]):.6g} in the file, "
            f"{float(ours[worst]):.6g} by minillama's; this RoPE scaling is not supported"
        )
    return scaled


def _decimal(value: float) -> float:
    """A float32 metadata value as the decimal it was written from: 1e-5 is stored as 9.99999975e-06,
    and the shortest decimal that rounds to the same float32 is 1e-05."""
    return float(np.format_float_positional(np.float32(value), unique=True))


def args_from_gguf(reader, path: str | os.PathLike) -> ModelArgs:
    """ModelArgs from a GGUF's `llama.*` metadata and its tensor table (see the module docstring)."""
    path = str(path)
    arch = field(reader, "general.architecture", None)
    if arch != "llama":
        raise ValueError(
            f"{path}: general.architecture is {arch!r}; minillama loads Llama-architecture GGUF files ('llama')"
        )
    names = {t.name for t in reader.tensors}
    dim, n_heads = (
        int(field(reader, "llama.embedding_length")),
        int(field(reader, "llama.attention.head_count")),
    )
    head_dim = dim // n_heads
    for key in ("llama.rope.dimension_count", "llama.attention.key_length", "llama.attention.value_length"):
        value = field(reader, key, head_dim)
        if int(value) != head_dim:
            raise ValueError(
                f"{path}: {key}={value} differs from embedding_length // head_count = {head_dim}; minillama "
                f"rotates and attends over whole heads of dim // n_heads channels"
            )
    tokens = field(reader, "tokenizer.ggml.tokens", None)
    embedding = {t.name: t for t in reader.tensors}.get("token_embd.weight")
    vocab = field(reader, "llama.vocab_size", None) or (len(tokens) if tokens else None)
    if vocab is None and embedding is not None:
        vocab = int(embedding.shape[1])  # ggml order: (d, v)
    if vocab is None:
        raise ValueError(
            f"{path}: no llama.vocab_size, token list or token_embd.weight to size the vocabulary"
        )
    args = ModelArgs(
        dim=dim,
        n_layers=int(field(reader, "llama.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(field(reader, "llama.attention.head_count_kv", n_heads)),
        vocab_size=int(vocab),
        norm_eps=_decimal(field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_decimal(field(reader, "llama.rope.freq_base", 10_000.0)),
        max_seq_len=int(field(reader, "llama.context_length", 131_072)),
        hidden_dim=int(field(reader, "llama.feed_forward_length")),
        tie_embeddings="output.weight" not in names,
    )
    args = _rope_scaling(reader, args, path)
    rules = [(k.multiple_of, k.ffn_dim_multiplier) for k in MODELS.values() if k.dim == args.dim]
    args = _normalise_ffn(args, rules)
    return args.replace(name=_catalogue_name(args, Path(path).name.removesuffix(GGUF_SUFFIX)))


def gguf_default_dtype(reader) -> torch.dtype:
    """The dtype `load(dtype=None)` gives: the file's 16-bit float type when its weights are all F16 or all
    BF16 (the norms may be F32), else float32 (quantised blocks have no torch dtype)."""
    kinds = {tensor_type(t) for t in reader.tensors if len(t.shape) > 1}
    return {frozenset({"F16"}): torch.float16, frozenset({"BF16"}): torch.bfloat16}.get(
        frozenset(kinds), torch.float32
    )


def dequantize(t) -> torch.Tensor:
    """One GGUF tensor as a float32 (or its own 16-bit) torch tensor in numpy order (rows first), in memory
    of its own (not a view of the mapped file)."""
    kind = tensor_type(t)
    shape = tuple(int(n) for n in reversed(t.shape))  # ggml lists the fastest axis first
    if kind == "F32" or kind == "F16":
        return torch.from_numpy(np.array(t.data)).reshape(shape)  # copied off the mapped file
    if kind == "BF16":
        raw = np.array(t.data).view(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(shape)
    from gguf.quants import dequantize as gguf_dequantize

    return torch.from_numpy(gguf_dequantize(t.data, t.tensor_type)).reshape(shape)


def read_gguf(path: Path, args: ModelArgs, expected: dict, device, dtype, progress, tied) -> dict:
    reader = open_gguf(path)
    found, stored = {}, {}
    for t in reader.tensors:
        if t.name == ROPE_FREQS:
            continue  # read by args_from_gguf: derived frequencies, not a parameter
        name = gguf_to_meta(t.name)
        where = f"{path.name}: {t.name!r}"
        if name is None:
            raise ValueError(f"unexpected tensor {where}: not a Llama tensor name")
        if tensor_type(t) not in SUPPORTED_TYPES:
            raise ValueError(
                f"{where} is stored as {tensor_type(t)}, a ggml type minillama does not dequantise; supported: "
                f"{', '.join(SUPPORTED_TYPES)} (requantise the file, e.g. with llama.cpp's llama-quantize)"
            )
        shape = tuple(int(n) for n in reversed(t.shape))
        found[name] = (shape, torch.float32, where)
        stored[name] = t
    check_tensors(found, expected, args, str(path), hf=False, tied=tied)
    dtype = dtype or gguf_default_dtype(reader)
    state = {}
    for name, t in tqdm(stored.items(), desc="loading tensors", unit="tensor", disable=not progress):
        state[name] = dequantize(t).to(device=device, dtype=dtype)
    return state
