"""Speculative decoding: greedy output equals plain greedy decoding whatever the draft (an unrelated
random model, a self-draft) across configs, k, ragged batches and stop tokens; sampled tokens follow the
target's distribution (the rejection rule, checked by total variation over many seeded draws); the
same seed gives the same tokens; bad drafts and bad k raise."""

import functools

import pytest
import torch
from conftest import CONFIGS, random_model

import minillama as ml
from minillama import speculative as sp

PROMPTS = [[5, 17, 240], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [200, 0, 42, 42, 7, 100, 3]]
NEW = 12


def unrelated_draft(args: ml.ModelArgs) -> ml.Transformer:
    """A smaller model of the same vocabulary with its own random weights: it rarely guesses right."""
    return random_model(args.replace(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=16), seed=7)


@functools.cache
def make_pair(name: str):
    args = CONFIGS[name]
    model = random_model(args, seed=1)
    drafts = {"unrelated": unrelated_draft(args), "self-bf16": sp.self_draft(model, "bf16")}
    drafts["self-int8"] = sp.self_draft(model, "int8")
    return model, drafts


@pytest.fixture(scope="module", params=["gqa4", "mqa"])
def pair(request):
    return make_pair(request.param)


# every k on one config, two on each of the others
@pytest.mark.parametrize(
    ("config", "k"),
    [("gqa4", 1), ("gqa4", 2), ("gqa4", 4), ("gqa4", 8), ("mha", 2), ("mha", 8), ("mqa", 1), ("mqa", 4)],
)
def test_greedy_output_equals_plain_greedy_decoding(config, k):
    model, drafts = make_pair(config)
    plain = ml.generate(model, PROMPTS, max_new_tokens=NEW)
    for kind, draft in drafts.items():
        stats = sp.SpeculativeStats()
        assert (
            ml.generate(model, PROMPTS, max_new_tokens=NEW, draft=draft, speculate_k=k, stats=stats) == plain
        )
        assert stats.tokens == len(PROMPTS) * NEW and stats.rounds >= (NEW - 1) / (k + 1)
        assert 1 <= stats.tokens_per_forward <= k + 1
        if kind == "unrelated":  # a random guess in a vocabulary of hundreds
            assert stats.acceptance_rate < 0.1, stats
        else:  # the target's own weights in bf16 or int8 predict what it predicts
            assert stats.acceptance_rate > 0.6, stats


def test_each_row_alone_and_the_statistics_add_up(pair):
    model, drafts = pair
    draft = drafts["self-bf16"]
    stats = sp.SpeculativeStats()
    batched = ml.generate(model, PROMPTS, max_new_tokens=NEW, draft=draft, speculate_k=3, stats=stats)
    assert batched == [
        ml.generate(model, [p], max_new_tokens=NEW, draft=draft, speculate_k=3)[0] for p in PROMPTS
    ]
    assert stats.proposed == 3 * stats.row_rounds and sum(stats.accepted_hist) == stats.row_rounds
    assert stats.accepted == sum(n * c for n, c in enumerate(stats.accepted_hist))
    assert stats.produced == stats.accepted + stats.row_rounds


def test_stop_tokens_end_rows_as_without_a_draft(pair):
    model, drafts = pair
    plain = ml.generate(model, PROMPTS, max_new_tokens=NEW)
    stops = {plain[0][4], plain[2][1]}  # tokens each of these rows produces, early
    expected = ml.generate(model, PROMPTS, max_new_tokens=NEW, stop_tokens=stops)
    assert any(len(row) < NEW for row in expected)
    for draft in (drafts["unrelated"], drafts["self-int8"]):
        for k in (2, 5):
            got = ml.generate(
                model, PROMPTS, max_new_tokens=NEW, stop_tokens=stops, draft=draft, speculate_k=k
            )
            assert got == expected


def test_stream_yields_the_same_tokens_round_by_round(pair):
    model, drafts = pair
    (plain,) = ml.generate(model, PROMPTS[1:2], max_new_tokens=NEW, stop_tokens=[7])
    streamed = ml.generate(
        model, PROMPTS[1:2], max_new_tokens=NEW, stop_tokens=[7], draft=drafts["self-bf16"], stream=True
    )
    assert not isinstance(streamed, list)
    assert list(streamed) == plain


def test_seeded_sampling_is_reproducible():
    args = CONFIGS["gqa4"]
    model = random_model(args, seed=1)
    draft = sp.self_draft(model, "bf16")
    kw = {"max_new_tokens": NEW, "temperature": 0.8, "top_p": 0.9, "draft": draft, "speculate_k": 3}
    a = ml.generate(model, PROMPTS, seed=4, **kw)
    assert a == ml.generate(model, PROMPTS, seed=4, **kw)
    assert a != ml.generate(model, PROMPTS, seed=5, **kw)


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total-variation distance between empirical counts and a distribution."""
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def test_the_rejection_rule_keeps_the_target_distribution():
    """`accept_sampled` on fixed p (k + 1 positions) and q (k positions) over 8 tokens, N rows: the
    round's i-th token, over the rows that reach it, is distributed as p_i. With N = 200,000 the
    expected TV distance of a correct sampler is below 0.004; drafting alone would be off by > 0.2."""
    g = torch.Generator().manual_seed(0)
    k, v, n = 2, 8, 200_000
    p = torch.softmax(2 * torch.randn(k + 1, v, generator=g), dim=-1)
    q = torch.softmax(2 * torch.randn(k, v, generator=g), dim=-1)
    drafts = torch.multinomial(q, n, replacement=True, generator=g).T  # [n, k], d_i ~ q_i
    kept, nxt = sp.accept_sampled(drafts, p.expand(n, -1, -1), q.expand(n, -1, -1), generator=g)
    seq = torch.cat((drafts, torch.zeros(n, 1, dtype=torch.long)), dim=1)
    seq[torch.arange(n), kept] = nxt  # the round's tokens: kept drafts, then the target's token
    for i in range(k + 1):
        reached = kept >= i
        counts = torch.bincount(seq[reached, i], minlength=v).float()
        assert tv(counts, p[i]) < 0.01, (i, tv(counts, p[i]))
        if i < k:
            assert tv(torch.bincount(drafts[:, i], minlength=v).float(), p[i]) > 0.2  # the test can fail
    expected_rate = torch.minimum(p[:k], q).sum(-1)  # P(accept d_i) = sum_x min(p_i(x), q_i(x))
    assert abs(kept.ge(1).float().mean() - expected_rate[0]) < 0.01


def test_first_speculative_token_follows_the_target_through_generate():
    """End to end on a vocabulary of 16: 20,000 seeded rows of one prompt, max_new_tokens=2. The first
    token comes from the target's prefill, the second from the first speculative round, drafted by an
    unrelated model (most proposals rejected). The second token's empirical distribution matches
    sum_t1 p(t1) p(t2 | t1) from full forwards of the target within TV 0.03 (a correct sampler's
    expected TV here is about 0.01); the draft's own distribution is further away than that."""
    args = ml.ModelArgs(
        dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=16, multiple_of=16, max_seq_len=32
    )
    model = random_model(args, seed=3)
    draft = random_model(args.replace(dim=16, n_heads=2, n_kv_heads=1), seed=4)
    prompt, n = [3, 1, 4, 1, 5], 20_000
    out = ml.generate(
        model, [prompt] * n, max_new_tokens=2, temperature=1.0, seed=0, draft=draft, speculate_k=2
    )
    second = torch.tensor([row[1] for row in out])
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt]))[0, -1], -1)
        nxt = torch.softmax(model(torch.tensor([prompt + [t] for t in range(16)]))[:, -1], -1)
        drafted = torch.softmax(draft(torch.tensor([prompt + [t] for t in range(16)]))[:, -1], -1)
    expected = first @ nxt
    counts = torch.bincount(second, minlength=16).float()
    assert tv(counts, expected) < 0.03, tv(counts, expected)
    assert 0.5 * (first @ drafted - expected).abs().sum() > 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speculate_k": 0}, "speculate_k=0 must be an integer >= 1"),
        ({"speculate_k": 2.5}, "speculate_k=2.5 must be an integer"),
        ({"speculate_k": 40, "max_seq_len": 48}, "speculate_k=40 does not fit the target's cache"),
    ],
)
def test_bad_k(kwargs, message):
    model = random_model(CONFIGS["gqa4"], seed=1)
    with pytest.raises(ValueError, match=message):
        ml.generate(model, PROMPTS, max_new_tokens=NEW, draft=unrelated_draft(CONFIGS["gqa4"]), **kwargs)


def test_bad_drafts():
    args = CONFIGS["gqa4"]
    model = random_model(args, seed=1)
    other_vocab = random_model(args.replace(vocab_size=301))
    with pytest.raises(ValueError, match=r"vocabulary \(301 tokens\) differs from the target's \(300\)"):
        ml.generate(model, PROMPTS, draft=other_vocab)
    with pytest.raises(ValueError, match="draft is the target model itself"):
        ml.generate(model, PROMPTS, draft=model)
    short = random_model(args.replace(max_seq_len=16))
    with pytest.raises(ValueError, match="does not fit the draft's cache"):
        ml.generate(model, PROMPTS, max_new_tokens=NEW, draft=short)
    with pytest.raises(ValueError, match="not a self-draft kind"):
        sp.self_draft(model, "fp8")
