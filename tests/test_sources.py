"""The pinned citations: well-formed links, sane line ranges, and lines that say what the claim says.

Entries pointing into meta-llama/llama-models @ 0e0b8c5 or transformers v5.24.0 are checked against
the installed packages (llama-models 0.3.0 has that revision's files line for line): the cited lines
must contain the identifiers typed below, which proves the pins without copying any code.
"""

import re

import pytest

from minillama.sources import EVIDENCE, SOURCES, Source, reference_lines

URL = re.compile(
    r"https://github\.com/[\w.-]+/[\w.-]+/blob/(?P<rev>[0-9a-f]{40}|v\d+(?:\.\d+)+)/(?P<path>[\w./-]+)"
    r"#L(?P<a>\d+)(?:-L(?P<b>\d+))?"
)

# what the cited lines must contain, read from the installed files
EXPECTED = {
    "config": [
        "LLAMA3_VOCAB_SIZE = 128256",
        "llama3_1_8b",
        '"dim": 4096',
        '"n_kv_heads": 8',
        '"multiple_of": 1024',
    ],
    "config-70b": ["LLAMA3_VOCAB_SIZE", "llama3_1_70b", '"dim": 8192', '"n_layers": 80', '"n_heads": 64'],
    "config-3.2-1b": ["llama3_2_1b", '"dim": 2048', '"n_layers": 16', '"ffn_dim_multiplier": 1.5'],
    "config-3.2-3b": ["llama3_2_3b", '"dim": 3072', '"n_layers": 28', '"n_heads": 24'],
    "config-3.3-70b": ["llama3_3_70b_instruct", '"dim": 8192', '"n_layers": 80', '"multiple_of": 4096'],
    "config-405b": [
        "llama3_1_405b",
        "bf16-mp8",
        '"dim": 16384',
        '"n_layers": 126',
        '"ffn_dim_multiplier": 1.2',
    ],
    "context": ["max_seq_length", "llama3_1", "131072"],
    "rope-scaling": [
        "def apply_scaling",
        "scale_factor = 8",
        "old_context_len = 8192",
        "def precompute_freqs_cis",
    ],
    "ref-heads": ["n_rep", "head_dim = args.dim // args.n_heads"],
    "ref-qkv": ["self.wq", "self.wk", "self.wv", "bias=False", "xk.view"],
    "ref-attn-reshape": ["xq.view", "xk.view", "transpose(1, 2)"],
    "ref-rope": ["def apply_rotary_emb", "view_as_complex", "type_as(xq)", "apply_rotary_emb(xq, xk"],
    "ref-rope-table": ["def precompute_freqs_cis", "apply_scaling", "max_seq_len * 2"],
    "ref-gqa": ["def repeat_kv", "n_rep", "repeat_kv(keys"],
    "ref-kv-cache": [
        "cache_k",
        "cache_v",
        "max_seq_len",
        "start_pos : start_pos + seqlen",
        ": start_pos + seqlen",
    ],
    "ref-scores": ["math.sqrt(self.head_dim)", "softmax(scores.float()", "torch.triu", "torch.hstack"],
    "ref-retrieval": ["self.wo", "torch.matmul(scores, values)", "return self.wo(output)"],
    "ref-rmsnorm": ["class RMSNorm", "torch.rsqrt", "x.float()", "self.weight"],
    "ref-swiglu": ["class FeedForward", "int(2 * hidden_dim / 3)", "multiple_of", "F.silu"],
    "ref-handoff": ["attention_norm", "ffn_norm", "h = x + self.attention", "out = h + self.feed_forward"],
    "ref-transformer": ["tok_embeddings", "self.norm", "self.output", "precompute_freqs_cis"],
    "ref-logits": ["def forward(self, tokens", "mask", ".float()"],
    "ref-generation-dtype": ["bfloat16", "torch.half"],
    "hf-rope": ["def rotate_half", "def apply_rotary_pos_emb", "torch.cat((freqs, freqs)", "rotate_half(q)"],
    "hf-rope-scaling": [
        "def _compute_llama3_parameters",
        "low_freq_factor",
        "original_max_position_embeddings",
    ],
    "hf-attention": ["def repeat_kv", "transpose(1, 2)", "cache.update"],
}

# the spans the seed documents show for their claims (shared/seeds/), typed from the seeds
SEED_SPANS = {
    "config": (19, 248),
    "qkv": (93, 160),
    "rope": (65, 160),
    "gqa": (78, 183),
    "scores": (179, 296),
    "retrieval": (121, 190),
    "handoff": (236, 248),
    "attn-reshape": (93, 183),
}


@pytest.mark.parametrize("key", list(SOURCES))
def test_entry_is_well_formed(key):
    s = SOURCES[key]
    assert s.key == key
    assert s.evidence in EVIDENCE
    assert s.claim.strip().endswith(".")
    m = URL.fullmatch(s.url)
    assert m, s.url
    assert m["rev"] == s.revision and m["path"] == s.path
    assert (int(m["a"]), int(m["b"] or m["a"])) == s.span
    assert s.lines, "at least one line range"
    previous = 0
    for start, end in s.lines:
        assert previous < start <= end
        previous = end
    assert len(s.urls) == len(s.lines) and all(URL.fullmatch(u) for u in s.urls)


@pytest.mark.parametrize("key", [k for k, s in SOURCES.items() if s.counterpart])
def test_counterparts_point_into_llama_models(key):
    other = SOURCES[SOURCES[key].counterpart]
    assert other.repo == "meta-llama/llama-models"
    assert other.revision == "0e0b8c519242d5833d8c11bffc1232b77ad7f301"


@pytest.mark.parametrize("key", list(EXPECTED))
def test_cited_lines_contain_the_claim(key):
    ref = reference_lines(key)
    assert ref.source is SOURCES[key]
    for identifier in EXPECTED[key]:
        assert identifier in ref.text, f"{key}: {identifier!r} not in {ref.source.label}"


def test_every_installed_pin_is_checked():
    installed = {"meta-llama/llama-models", "huggingface/transformers"}
    unchecked = [
        k for k, s in SOURCES.items() if s.repo in installed and s.revision != "v4.46.3" and k not in EXPECTED
    ]
    assert not unchecked


@pytest.mark.parametrize("key", list(SEED_SPANS))
def test_seed_claims_keep_the_seed_pins(key):
    s = SOURCES[key]
    assert s.span == SEED_SPANS[key]
    expected_repo = "meta-llama/llama-models" if key == "config" else "meta-llama/llama3"
    assert s.repo == expected_repo
    assert (
        s.short_revision
        == {"meta-llama/llama-models": "0e0b8c519242", "meta-llama/llama3": "a0940f9cf706"}[s.repo]
    )


def test_labels_read_as_the_seed():
    assert SOURCES["config"].label == "sku_list.py 19, 231–248"
    assert SOURCES["heads"].label == "model.py 93–98"
    assert SOURCES["generation-dtype"].label == "generation.py 105–108"


def test_reference_lines_of_a_llama3_claim_use_the_installed_counterpart():
    ref = reference_lines("gqa")
    assert ref.package == "llama-models" and ref.version == "0.3.0"
    assert ref.source.key == "ref-gqa"
    assert "# … lines 106–110 omitted …" in ref.text
    assert "def repeat_kv" in str(ref) and "```python" in ref._repr_markdown_()


def test_reference_lines_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        reference_lines("nope")
    with pytest.raises(ValueError, match="no installed package"):
        reference_lines("hf-permute")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"evidence": "strong"}, "evidence"),
        ({"revision": "a0940f9"}, "40-hex"),
        ({"lines": (10, 5)}, "non-empty"),
        ({"lines": ((10, 20), (15, 30))}, "ordered"),
    ],
)
def test_bad_entries_are_rejected(change, message):
    fields = {
        "key": "x",
        "claim": "X.",
        "repo": "meta-llama/llama3",
        "revision": "a0940f9cf7065d45bb6675660f80d305c041a754",
        "path": "llama/model.py",
        "lines": (1, 2),
        "evidence": "direct",
    }
    with pytest.raises(ValueError, match=message):
        Source(**{**fields, **change})
