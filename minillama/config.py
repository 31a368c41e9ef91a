"""The shape of a Llama 3.1 model: `ModelArgs` and the `MODELS` catalogue (chapter 1).

Field names are Meta's (meta-llama/llama3 `llama/model.py` 19–32, with Llama 3.1's
`use_scaled_rope`); the published sizes come from Meta's catalogue, meta-llama/llama-models
`models/sku_list.py` (8B 231–248, 70B 249–266, 405B 267–285, Llama 3.2 1B 329–345 and 3B 346–362,
Llama 3.3 70B from 769 with the 3.1 70B's shape; see `minillama.sources`). Llama 3.2 1B and 3B tie the
output head to the embedding and scale RoPE by 32, not 8: both are in their Hugging Face `config.json`
(`tie_word_embeddings: true`, `rope_scaling.factor: 32.0`), not in Meta's `params.json`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 4096  # width of the residual stream, d
    n_layers: int = 32  # transformer blocks
    n_heads: int = 32  # query heads, h
    n_kv_heads: int = 8  # key/value heads, kv; each serves g = h // kv query heads
    vocab_size: int = 128_256  # 128,000 BPE ranks + 256 special tokens
    multiple_of: int = 1024  # the FFN width is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = 1.3  # scales Meta's 2/3 · 4d FFN width before rounding
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 500_000.0  # RoPE base: wavelengths run from 2π to ~2π·theta
    use_scaled_rope: bool = True  # Llama 3.1's long-context frequency scaling
    max_seq_len: int = 131_072  # longest context: rotary tables and caches are sized by it
    rope_scale_factor: float = 8.0  # low frequencies are divided by this
    rope_low_freq_factor: float = 1.0  # wavelengths above original/low are fully scaled
    rope_high_freq_factor: float = 4.0  # wavelengths below original/high are kept
    rope_original_max_seq_len: int = 8192  # the context Llama 3 was trained at
    hidden_dim: int | None = None  # explicit FFN width (HF's intermediate_size); None: Meta's rounding
    tie_embeddings: bool = False  # the output head is the embedding matrix (Llama 3.2 1B and 3B)
    name: str = "custom"  # display name for cards and tables

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by n_heads={self.n_heads}: every query head needs "
                f"dim // n_heads channels; pick n_heads dividing {self.dim}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}: each KV head "
                f"must serve the same number of query heads; pick n_kv_heads dividing {self.n_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is odd: rotary embedding rotates pairs of channels")
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "max_seq_len"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}={getattr(self, field)} must be a positive integer")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_rep(self) -> int:
        """g: query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """Meta's FeedForward width (llama3 `llama/model.py` 193–219): 2/3 of 4d, times the
        multiplier, rounded up to `multiple_of`. 8B: int(int(2·16384/3)·1.3) = 14198 -> 14336."""
        if self.hidden_dim is not None:
            return self.hidden_dim
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def replace(self, **changes) -> ModelArgs:
        return dataclasses.replace(self, **changes)


def close_matches(name: str, names) -> list[str]:
    """The catalogue names nearest to `name` (case and separators ignored first), best first."""
    names = list(names)
    folded = {n.lower().replace("_", "-").replace(" ", "-"): n for n in names}
    key = str(name).lower().replace("_", "-").replace(" ", "-")
    if key in folded:
        return [folded[key]]
    return [folded[m] for m in difflib.get_close_matches(key, list(folded), n=3, cutoff=0.6)]


def unknown_model(name: str, names) -> str:
    """The message for a name the catalogue lacks: the close matches, then every valid name."""
    names = list(names)
    near = close_matches(name, names)
    hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    return f"unknown model {name!r}; {hint}valid models: {', '.join(names)}"


class Catalogue(dict):
    """A dict of `ModelArgs` by name whose missing key raises a `KeyError` naming the close matches."""

    def __missing__(self, key):
        raise KeyError(unknown_model(key, self))


MODELS: dict[str, ModelArgs] = Catalogue({
    "llama-3.1-8b": ModelArgs(name="Llama 3.1 8B"),
    "llama-3.1-70b": ModelArgs(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, multiple_of=4096, name="Llama 3.1 70B"
    ),
    "llama-3.1-405b": ModelArgs(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        multiple_of=4096,
        ffn_dim_multiplier=1.2,
        name="Llama 3.1 405B",
    ),
    # the small ones a laptop runs: output head tied to the embedding, RoPE scaled by 32
    "llama-3.2-1b": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        multiple_of=256,
        ffn_dim_multiplier=1.5,
        rope_scale_factor=32.0,
        tie_embeddings=True,
        name="Llama 3.2 1B",
    ),
    "llama-3.2-3b": ModelArgs(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        multiple_of=256,
        ffn_dim_multiplier=1.0,
        rope_scale_factor=32.0,
        tie_embeddings=True,
        name="Llama 3.2 3B",
    ),
    # the 3.1 70B's shape, trained further (instruct only)
    "llama-3.3-70b": ModelArgs(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, multiple_of=4096, name="Llama 3.3 70B"
    ),
    # the 8B's structure at a size a laptop CPU runs in milliseconds: g = 4 query heads per KV head,
    # the real vocabulary (so the real tokenizer works), scaled RoPE
    "tiny": ModelArgs(
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=2,
        multiple_of=256,
        max_seq_len=2048,
        name="tiny",
    ),
})
