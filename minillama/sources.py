"""Pinned citations: every claim a card or chapter makes about Llama 3.1, tied to the lines that show it.

A `Source` names a repository, a pinned revision (a full commit sha, or a release tag), a path and
one or more line ranges, with an evidence level: "direct" (those lines compute the claim) or
"contextual" (they support it). The project cites these lines; it does not copy them.
`reference_lines(key)` reads the cited lines live from the installed `llama_models` (or
`transformers`) package for display beside minillama's code in a notebook.

Pins (checked against the repositories' history):
- meta-llama/llama3 @ a0940f9 `llama/model.py`: Meta's Llama 3 reference, which computes as Llama 3.1
  except for the scaled rotary frequencies;
- meta-llama/llama-models @ 0e0b8c5: the Llama 3.1 catalogue (`models/sku_list.py`) and the scaled
  RoPE; its files are those of the `llama-models==0.3.0` wheel, line for line;
- huggingface/transformers at release tags, where Hugging Face's layout differs from Meta's
  (half-split rotary pairs and the q/k weight permutation that goes with them).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

LLAMA3 = ("meta-llama/llama3", "a0940f9cf7065d45bb6675660f80d305c041a754")
LLAMA_MODELS = ("meta-llama/llama-models", "0e0b8c519242d5833d8c11bffc1232b77ad7f301")
TRANSFORMERS = ("huggingface/transformers", "v5.24.0")
# the conversion script left the transformers packages in 5.x; cited at the last 4.x release read here
TRANSFORMERS_CONVERT = ("huggingface/transformers", "v4.46.3")
# published quantisation results (chapter 9): the READMEs at these commits hold the tables cited
GPT_FAST = ("pytorch-labs/gpt-fast", "d2c5d8223fd00ab5ce469d8fdd93a7de78fb8b4a")
TORCHAO = ("pytorch/ao", "fd6e4b1f36d644de9b56be69ffe0f1a24b6ea111")

# the installed package whose files hold a repository's pinned lines: repo -> (distribution, version,
# repository path prefix, import name)
INSTALLED = {
    LLAMA_MODELS: ("llama-models", "0.3.0", "models/", "llama_models"),
    TRANSFORMERS: ("transformers", "5.24.0", "src/transformers/", "transformers"),
}

EVIDENCE = ("direct", "contextual")
_SHA = re.compile(r"[0-9a-f]{40}")
_TAG = re.compile(r"v\d+(\.\d+)+")


@dataclass(frozen=True)
class Source:
    key: str
    claim: str
    repo: str  # owner/name on GitHub
    revision: str  # a full 40-hex commit sha, or a release tag such as v5.24.0
    path: str  # path inside the repository
    lines: tuple[tuple[int, int], ...]  # inclusive line ranges, in order; (a, b) alone is one range
    evidence: str  # "direct" or "contextual"
    note: str = ""
    counterpart: str | None = None  # key of the same computation in the installed llama-models

    def __post_init__(self):
        lines = self.lines
        if len(lines) == 2 and all(isinstance(n, int) for n in lines):
            lines = (lines,)
        object.__setattr__(self, "lines", tuple(tuple(r) for r in lines))
        if self.evidence not in EVIDENCE:
            raise ValueError(f"{self.key}: evidence={self.evidence!r} must be one of {EVIDENCE}")
        if not (_SHA.fullmatch(self.revision) or _TAG.fullmatch(self.revision)):
            raise ValueError(
                f"{self.key}: revision={self.revision!r} must be a full 40-hex commit sha or a tag like v5.24.0"
            )
        previous_end = 0
        for start, end in self.lines:
            if not previous_end < start <= end:
                raise ValueError(
                    f"{self.key}: line ranges {self.lines} must be non-empty, ordered and disjoint"
                )
            previous_end = end

    @property
    def short_revision(self) -> str:
        return self.revision[:12] if _SHA.fullmatch(self.revision) else self.revision

    @property
    def span(self) -> tuple[int, int]:
        return self.lines[0][0], self.lines[-1][1]

    @property
    def url(self) -> str:
        """The pinned file at the span of the cited lines (GitHub highlights one range)."""
        start, end = self.span
        anchor = f"#L{start}" if start == end else f"#L{start}-L{end}"
        return f"https://github.com/{self.repo}/blob/{self.revision}/{self.path}{anchor}"

    @property
    def urls(self) -> tuple[str, ...]:
        """One pinned link per cited range."""
        base = f"https://github.com/{self.repo}/blob/{self.revision}/{self.path}"
        return tuple(base + (f"#L{a}" if a == b else f"#L{a}-L{b}") for a, b in self.lines)

    @property
    def ranges(self) -> str:
        return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in self.lines)

    @property
    def label(self) -> str:
        """How a card names it: "model.py 93–120, 153–160"."""
        return f"{Path(self.path).name} {self.ranges}"

    def markdown(self) -> str:
        return (
            f"[{self.label}]({self.url}) · {self.evidence} · {self.claim} "
            f"({self.repo} @ `{self.short_revision}`)"
        )


def _llama3(key, claim, lines, evidence="direct", path="llama/model.py", **kw) -> Source:
    return Source(key, claim, *LLAMA3, path, lines, evidence, **kw)


def _models(key, claim, path, lines, evidence="direct", **kw) -> Source:
    return Source(key, claim, *LLAMA_MODELS, path, lines, evidence, **kw)


def _hf(key, claim, path, lines, evidence="direct", pin=TRANSFORMERS, **kw) -> Source:
    return Source(key, claim, *pin, path, lines, evidence, **kw)


_ENTRIES = [
    # the configuration: Meta's catalogue
    _models(
        "config",
        "Meta's Llama 3.1 8B base catalogue entry: width, layers, query and KV heads, the vocabulary "
        "(LLAMA3_VOCAB_SIZE, line 19), FFN rounding, epsilon, rope_theta and use_scaled_rope.",
        "models/sku_list.py",
        ((19, 19), (231, 248)),
    ),
    _models(
        "config-70b",
        "Meta's Llama 3.1 70B base catalogue entry (8,192 wide, 80 layers, 64 query and 8 KV heads).",
        "models/sku_list.py",
        ((19, 19), (249, 266)),
    ),
    _models(
        "config-405b",
        "Meta's Llama 3.1 405B base catalogue entry, BF16 weights for 8 GPUs (16,384 wide, 126 layers, "
        "128 query and 8 KV heads, FFN multiplier 1.2).",
        "models/sku_list.py",
        ((19, 19), (267, 285)),
    ),
    _models(
        "config-3.2-1b",
        "Meta's Llama 3.2 1B base catalogue entry (2,048 wide, 16 layers, 32 query and 8 KV heads, FFN "
        "multiplier 1.5, multiple_of 256). The tied head and RoPE factor 32 are not in it (see the card's note).",
        "models/sku_list.py",
        ((19, 19), (329, 346)),
    ),
    _models(
        "config-3.2-3b",
        "Meta's Llama 3.2 3B base catalogue entry (3,072 wide, 28 layers, 24 query and 8 KV heads, FFN "
        "multiplier 1.0, multiple_of 256). The tied head and RoPE factor 32 are not in it (see the card's note).",
        "models/sku_list.py",
        ((19, 19), (347, 364)),
    ),
    _models(
        "config-3.3-70b",
        "Meta's Llama 3.3 70B instruct catalogue entry: the Llama 3.1 70B's shape.",
        "models/sku_list.py",
        ((19, 19), (771, 788)),
    ),
    _models(
        "context",
        "The Llama 3.1 family's maximum sequence length, 131,072 positions.",
        "models/sku_types.py",
        (199, 208),
        note="line numbers read from the llama-models 0.3.0 wheel, the code at this revision",
    ),
    # Meta's reference implementation, meta-llama/llama3 llama/model.py
    _llama3(
        "heads",
        "Head counts, the group size n_rep = n_heads // n_kv_heads and head_dim = dim // n_heads.",
        (93, 98),
        counterpart="ref-heads",
    ),
    _llama3(
        "qkv",
        "Separate bias-free Q/K/V projections use the query and KV head widths, then reshape into heads.",
        ((93, 120), (153, 160)),
        counterpart="ref-qkv",
    ),
    _llama3(
        "attn-reshape",
        "Queries reshape into query heads, keys and values into KV heads; the reference transposes "
        "into head-first order for the score computation.",
        ((93, 98), (153, 158), (179, 183)),
        evidence="contextual",
        counterpart="ref-attn-reshape",
    ),
    _llama3(
        "rope",
        "Complex-pair rotations apply to queries and keys (interleaved channel pairs), with their "
        "original dtype restored.",
        ((65, 75), (156, 160)),
        counterpart="ref-rope",
    ),
    _llama3(
        "rope-table",
        "The rotary table is precomputed once for 2 · max_seq_len positions and sliced at "
        "start_pos .. start_pos + seqlen each call.",
        ((49, 54), (251, 275)),
        evidence="contextual",
        note="llama3's precompute_freqs_cis is unscaled; Llama 3.1 scales it (see rope-scaling)",
        counterpart="ref-rope-table",
    ),
    _models(
        "rope-scaling",
        "Llama 3.1 frequency scaling: scale factor 8, low/high frequency factors 1 and 4, original "
        "context 8,192; wavelengths above 8,192 divided by 8, below 2,048 kept, a smooth blend between; "
        "applied when the table is precomputed with use_scaled.",
        "models/llama3/model.py",
        ((45, 62), (65, 72)),
    ),
    _llama3(
        "gqa",
        "Each KV head serves a group of n_rep query heads: the reference expands KV heads (query head i "
        "reads KV head i // n_rep) before the score and value products.",
        ((78, 87), (93, 98), (171, 183)),
        counterpart="ref-gqa",
    ),
    _llama3(
        "kv-cache",
        "cache_k and cache_v buffers [max_batch, max_seq_len, n_kv_heads, head_dim]; a call writes rows "
        "start_pos .. start_pos + seqlen - 1 and reads rows 0 .. start_pos + seqlen - 1.",
        ((129, 144), (165, 169)),
        counterpart="ref-kv-cache",
    ),
    _llama3(
        "scores",
        "Queries multiply transposed keys, scores are divided by the square root of the head width, a "
        "causal mask (widened by start_pos zero columns) is added, and softmax runs over key positions "
        "in float32.",
        ((179, 187), (284, 296)),
        counterpart="ref-scores",
    ),
    _llama3(
        "retrieval",
        "The attention weights multiply the values; head outputs are merged and passed through the "
        "bias-free output projection wo.",
        ((121, 127), (184, 190)),
        counterpart="ref-retrieval",
    ),
    _llama3(
        "rmsnorm",
        "RMSNorm: x · rsqrt(mean(x²) + eps) computed in float32, cast back to the input dtype, times a "
        "learned gain.",
        (35, 46),
        counterpart="ref-rmsnorm",
    ),
    _llama3(
        "swiglu",
        "SwiGLU feed-forward: hidden = int(2 · 4d / 3), times ffn_dim_multiplier, rounded up to "
        "multiple_of; w2(silu(w1 x) · w3 x), all bias-free.",
        (193, 219),
        counterpart="ref-swiglu",
    ),
    _llama3(
        "handoff",
        "Attention receives attention_norm(x) and its update is added to x; the feed-forward receives "
        "ffn_norm(h) and its update is added to h.",
        (236, 248),
        counterpart="ref-handoff",
    ),
    _llama3(
        "transformer",
        "The model: token embedding, n_layers blocks, final RMSNorm and an untied output head.",
        (251, 275),
        counterpart="ref-transformer",
    ),
    _llama3(
        "logits",
        "forward(tokens, start_pos): embed, run the blocks with the causal mask, final norm, logits in "
        "float32.",
        (277, 302),
        counterpart="ref-logits",
    ),
    _llama3(
        "generation-dtype",
        "Inference runs in bf16 on GPUs that support it (else fp16): the default tensor type is set "
        "before the model is built.",
        (105, 108),
        evidence="contextual",
        path="llama/generation.py",
        counterpart="ref-generation-dtype",
    ),
    # the same computations in meta-llama/llama-models models/llama3 (the installed 0.3.0 wheel)
    _models(
        "ref-heads", "Head counts, n_rep and head_dim (llama-models).", "models/llama3/model.py", (111, 116)
    ),
    _models(
        "ref-qkv",
        "Bias-free Q/K/V projections and the reshape into heads (llama-models).",
        "models/llama3/model.py",
        ((111, 138), (171, 178)),
    ),
    _models(
        "ref-attn-reshape",
        "Reshape into query and KV heads, then head-first transposes (llama-models).",
        "models/llama3/model.py",
        ((171, 176), (193, 195)),
        evidence="contextual",
    ),
    _models(
        "ref-rope",
        "Complex-pair rotation of queries and keys (llama-models).",
        "models/llama3/model.py",
        ((83, 93), (174, 178)),
    ),
    _models(
        "ref-rope-table",
        "The scaled rotary table for 2 · max_seq_len positions (llama-models).",
        "models/llama3/model.py",
        ((65, 72), (273, 278)),
        evidence="contextual",
    ),
    _models(
        "ref-gqa",
        "repeat_kv and the expansion of KV heads before the products (llama-models).",
        "models/llama3/model.py",
        ((96, 105), (111, 116), (189, 195)),
    ),
    _models(
        "ref-kv-cache",
        "The cache buffers, and the rows a call writes and reads (llama-models).",
        "models/llama3/model.py",
        ((147, 162), (183, 187)),
    ),
    _models(
        "ref-scores",
        "Scaled scores, the causal mask widened by start_pos, float32 softmax (llama-models).",
        "models/llama3/model.py",
        ((193, 199), (287, 303)),
    ),
    _models(
        "ref-retrieval",
        "Weights times values, merged heads, output projection wo (llama-models).",
        "models/llama3/model.py",
        ((139, 145), (196, 202)),
    ),
    _models("ref-rmsnorm", "RMSNorm in float32 (llama-models).", "models/llama3/model.py", (31, 42)),
    _models("ref-swiglu", "The SwiGLU feed-forward (llama-models).", "models/llama3/model.py", (205, 225)),
    _models(
        "ref-handoff",
        "Pre-norm residual handoff in the block (llama-models).",
        "models/llama3/model.py",
        (242, 254),
    ),
    _models(
        "ref-transformer",
        "Embedding, blocks, final norm, untied head (llama-models).",
        "models/llama3/model.py",
        (257, 278),
    ),
    _models(
        "ref-logits",
        "The forward pass: mask, blocks, final norm, float32 logits (llama-models).",
        "models/llama3/model.py",
        (280, 309),
    ),
    _models(
        "ref-generation-dtype",
        "bf16 by default on GPUs that support it, else fp16 (llama-models).",
        "models/llama3/generation.py",
        (126, 130),
        evidence="contextual",
    ),
    # Hugging Face transformers, where its layout differs from Meta's
    _hf(
        "hf-rope",
        "Hugging Face rotates half-split pairs (channel i with i + head_dim/2): cos/sin tables repeat the "
        "frequencies twice, rotate_half and apply_rotary_pos_emb.",
        "src/transformers/models/llama/modeling_llama.py",
        ((110, 116), (119, 123), (126, 127), (145, 149)),  # apply_rotary_pos_emb without its docstring
    ),
    _hf(
        "hf-rope-scaling",
        "Hugging Face's llama3 rope_type computes the same scaled inverse frequencies from the config's "
        "factor, low/high frequency factors and original_max_position_embeddings.",
        "src/transformers/modeling_rope_utils.py",
        (581, 663),
    ),
    _hf(
        "hf-attention",
        "Hugging Face keeps queries, keys and values head-first, [b, heads, t, head_dim], and its cache "
        "stores keys and values in that layout.",
        "src/transformers/models/llama/modeling_llama.py",
        ((168, 177), (241, 252)),
        evidence="contextual",
    ),
    _hf(
        "hf-permute",
        "Meta's wq and wk rows are permuted into the half-split layout when a checkpoint is converted to "
        "Hugging Face's format (wv, wo untouched).",
        "src/transformers/models/llama/convert_llama_weights_to_hf.py",
        ((221, 223), (244, 251)),
        pin=TRANSFORMERS_CONVERT,
        note="the conversion script is not shipped in the transformers 5.x packages",
    ),
    # weight-only quantisation (chapter 9): published measurements on the real models
    Source(
        "gpt-fast-quant",
        "gpt-fast on an A100-80GB (power-limited to 330 W): Llama-2-7B decodes at 104.9 tok/s in bf16, "
        "155.58 with int8 weights and 196.80 with int4 (group 32).",
        *GPT_FAST,
        "README.md",
        (46, 56),
        "direct",
    ),
    Source(
        "torchao-quant-llama3",
        "torchao on an A100-80GB: Llama-3-8B wikitext perplexity 7.441 in bf16, 7.447 with int8 weight-only "
        "(153.03 tok/s against 95.64), 8.316 with int4 weight-only in groups of 64 (180.80 tok/s), 7.921 with "
        "int4 chosen by GPTQ.",
        *TORCHAO,
        "torchao/quantization/README.md",
        (16, 21),
        "direct",
    ),
    Source(
        "torchao-quant-llama31",
        "torchao on an H100: Llama-3.1-8B wikitext perplexity 7.54 in bf16, 7.56 int8 weight-only, 8.44 int4 "
        "weight-only in groups of 64.",
        *TORCHAO,
        "torchao/quantization/README.md",
        (32, 37),
        "direct",
    ),
    # speculative decoding (chapter 10): a published GPU measurement, and a reference loop to compare with
    Source(
        "gpt-fast-speculative-bench",
        "gpt-fast on an A100-80GB (power-limited to 330 W): Llama-2-70B with int4 weights (groups of 32) "
        "decodes at 25.25 tok/s, and at 48.4 tok/s with Llama-2-7B in int4 as its speculative draft.",
        *GPT_FAST,
        "README.md",
        ((46, 47), (54, 59)),
        "direct",
    ),
    Source(
        "gpt-fast-speculative",
        "gpt-fast's speculative_decode: the draft decodes k tokens one at a time, the target runs one forward "
        "over the k + 1 positions, a draft token is kept with probability min(1, target / draft), the first "
        "rejected position draws from max(0, target - draft) normalised, and after a full acceptance the "
        "draft is fed its last proposal.",
        "pytorch-labs/gpt-fast",
        "a4bd2f89999fde73a0224a78b7c60c73475971ec",
        "generate.py",
        (87, 135),
        "direct",
        note="batch 1 only; its comments name the target probability q and the draft's p, the reverse of the paper",
    ),
]

# tensor parallelism (chapter 11): Meta's model-parallel layers, and the three references the chapter follows;
# line numbers counted in the pinned files (the repositories are not installed packages)
TP_TUTORIAL = ("pytorch/tutorials", "8f3d9eef6973751e92acf14d9f55099357cd0068")
TORCHTITAN = ("pytorch/torchtitan", "81c1243395b46ce693a0681cfe1bb20e9b9433fb")
GPT_FAST = ("pytorch-labs/gpt-fast", "9ac48bc50e2e35a390c309f315ba2c767b6e582d")
_ENTRIES += [
    _models(
        "ref-model-parallel",
        "Meta's reference builds wq, wk, wv (and w1, w3, the output head) as fairscale ColumnParallelLinear "
        "without gathering their output, wo and w2 as RowParallelLinear on parallel input, and the token "
        "embedding as VocabParallelEmbedding: the split its multi-shard checkpoints are cut along.",
        "models/llama3/model.py",
        ((118, 145), (220, 222), (264, 264), (271, 271)),
    ),
    Source(
        "tp-tutorial",
        "PyTorch's tensor-parallel tutorial: a plan of ColwiseParallel wq/wk/wv/w1/w3 and RowwiseParallel "
        "wo/w2 per block, the head count adjusted to the local count, parallelize_module applied per block, "
        "and a row-wise embedding with a column-wise output head replicated at the end.",
        *TP_TUTORIAL,
        "intermediate_source/TP_tutorial.rst",
        ((125, 140), (143, 164), (166, 182)),
        "direct",
    ),
    Source(
        "torchtitan-tp",
        "torchtitan applies tensor parallelism to Llama as a plan of data: RowwiseParallel embedding and "
        "ColwiseParallel head on the model, ColwiseParallel wq/wk/wv/w1/w3 and RowwiseParallel wo/w2 in "
        "each block (with sequence parallelism on the norms, which inference does not need).",
        *TORCHTITAN,
        "torchtitan/models/llama3/infra/parallelize.py",
        ((123, 150), (178, 203)),
        "direct",
    ),
    Source(
        "gpt-fast-tp",
        "gpt-fast cuts the same split by hand: column-wise rows (dim 0) or row-wise columns (dim 1) of each "
        "weight per rank, w1/w3 column-wise and w2 row-wise with an all-reduce after the feed-forward, the "
        "fused wqkv column-wise and wo row-wise with an all-reduce after attention, local head counts set "
        "by dividing by the world size.",
        *GPT_FAST,
        "tp.py",
        ((48, 98), (104, 150)),
        "direct",
    ),
]

# chapter 11: the measured tensor-parallel decode speeds that calibrate the per-collective latency
_ENTRIES += [
    Source(
        "gpt-fast-tp-bench",
        "gpt-fast on A100-80GB GPUs power-limited to 330 W: Llama-2-70B decodes at 20.53 tok/s on 2 GPUs, "
        "34.15 on 4 and 47.25 on 8 with tensor parallelism (on 1 GPU it does not fit).",
        "pytorch-labs/gpt-fast",
        "d2c5d8223fd00ab5ce469d8fdd93a7de78fb8b4a",
        "README.md",
        ((46, 47), (61, 71)),
        "direct",
    ),
    Source(
        "gpt-fast-tp-bench-intra",
        "gpt-fast's README after its tensor-parallel runs moved to PyTorch's intra-node all-reduce "
        "(ENABLE_INTRA_NODE_COMM=1, commit message: pytorch/pytorch#114001): Llama-2-70B at 21.32 tok/s "
        "on 2 A100-80GB GPUs, 38.01 on 4 and 62.50 on 8, same machine.",
        "pytorch-labs/gpt-fast",
        "c5d345462c8d455c7c5f0fc96d175d4e2142501e",
        "README.md",
        ((47, 47), (61, 71), (133, 136)),
        "direct",
    ),
]

SOURCES: dict[str, Source] = {s.key: s for s in _ENTRIES}


@dataclass(frozen=True)
class ReferenceLines:
    """Cited lines read from an installed package: shown beside minillama's code, never copied."""

    source: Source
    package: str
    version: str
    text: str

    def __str__(self) -> str:
        return f"# {self.package} {self.version} · {self.source.label}\n{self.text}"

    def _repr_markdown_(self) -> str:
        return (
            f"**{self.package} {self.version}** · [{self.source.label}]({self.source.url})\n\n"
            f"```python\n{self.text}\n```"
        )


def _installed_file(source: Source) -> tuple[Path, str, str]:
    pin = (source.repo, source.revision)
    if pin not in INSTALLED:
        raise ValueError(
            f"{source.key} is pinned to {source.repo} @ {source.short_revision}, which no installed package "
            f"holds; installed pins: {sorted(f'{r} @ {v}' for r, v in INSTALLED)}"
        )
    dist, pinned_version, prefix, module = INSTALLED[pin]
    version = importlib.metadata.version(dist)
    if version != pinned_version:
        raise ValueError(
            f"{source.key}: the line numbers are those of {dist}=={pinned_version}, but {version} is "
            f"installed; install {dist}=={pinned_version} to read the cited lines"
        )
    spec = importlib.util.find_spec(module)
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / source.path.removeprefix(prefix), dist, version


def reference_lines(key: str) -> ReferenceLines:
    """The cited lines of `SOURCES[key]` as the installed package has them (llama-models 0.3.0 for
    Meta's code, transformers 5.24.0 for Hugging Face's). A meta-llama/llama3 claim is shown through its
    llama-models counterpart, the same computation in the installed package."""
    if key not in SOURCES:
        raise ValueError(f"unknown source {key!r}; known: {', '.join(SOURCES)}")
    source = SOURCES[key]
    if (source.repo, source.revision) not in INSTALLED and source.counterpart:
        source = SOURCES[source.counterpart]
    path, dist, version = _installed_file(source)
    lines = path.read_text().splitlines()
    parts, previous_end = [], None
    for start, end in source.lines:
        if previous_end is not None and start > previous_end + 1:
            skipped = (
                f"{previous_end + 1}" if start - 1 == previous_end + 1 else f"{previous_end + 1}–{start - 1}"
            )
            parts.append(f"# … lines {skipped} omitted …")
        parts.extend(lines[start - 1 : end])
        previous_end = end
    return ReferenceLines(source, dist, version, "\n".join(parts))
