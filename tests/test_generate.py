"""Generation: ragged batches equal each row alone, cached decode equals full recompute, sampling is
seeded and samples what it says, stop tokens end rows, streaming is UTF-8 safe."""

import pytest
import torch
from conftest import CONFIGS, random_model, rel_err

import minillama as ml
from minillama.generate import decode_one_token, prefill, sample

ARGS = CONFIGS["gqa4"]  # dim 64, 8 heads over 2 KV heads, vocab 300, max_seq_len 256
PROMPTS = [[5, 17, 240], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [299, 0, 42, 42, 7, 100, 3]]


@pytest.fixture(scope="module")
def model():
    return random_model(ARGS)


@pytest.fixture(scope="module")
def tokenizer():
    return ml.Tokenizer.default()


def test_ragged_batch_equals_each_row_alone(model):
    batched = ml.generate(model, PROMPTS, max_new_tokens=12)
    alone = [ml.generate(model, [p], max_new_tokens=12)[0] for p in PROMPTS]
    assert batched == alone
    assert all(len(row) == 12 for row in batched)


def test_greedy_tokens_are_the_argmax_of_a_full_recompute(model):
    (out,) = ml.generate(model, [PROMPTS[1]], max_new_tokens=10)
    seq = PROMPTS[1] + out
    with torch.no_grad():
        logits = model(torch.tensor([seq]))[0]  # no cache at all
    assert logits[len(PROMPTS[1]) - 1 : -1].argmax(-1).tolist() == out


def test_ragged_prefill_and_decode_logits_match_each_row_recomputed(model):
    """Drive prefill and decode_one_token on a right-padded batch; every step's logits equal a full
    forward of that row alone (no cache, no padding)."""
    b, longest, steps = len(PROMPTS), max(map(len, PROMPTS)), 6
    tokens = torch.zeros(b, longest, dtype=torch.long)
    for r, p in enumerate(PROMPTS):
        tokens[r, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in PROMPTS])
    model.setup_cache(b, longest + steps)
    with torch.no_grad():
        token, logits = prefill(model, tokens, lengths)
        generated, step_logits = [token], [logits]
        pos = lengths.clone()
        for _ in range(steps - 1):
            token, logits = decode_one_token(model, token, pos)
            pos += 1
            generated.append(token)
            step_logits.append(logits)
        new = torch.cat(generated, dim=1)
        for r, p in enumerate(PROMPTS):
            full = model(torch.tensor([p + new[r, :-1].tolist()]))[0, len(p) - 1 :]
            ours = torch.stack([s[r] for s in step_logits])
            assert rel_err(ours, full) < 1e-5


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(model):
    kw = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.95}
    a = ml.generate(model, PROMPTS, seed=1, **kw)
    assert a == ml.generate(model, PROMPTS, seed=1, **kw)
    assert a != ml.generate(model, PROMPTS, seed=2, **kw)
    assert a != ml.generate(model, PROMPTS, max_new_tokens=16)  # not greedy


def test_top_k_1_and_a_tiny_top_p_are_greedy(model):
    greedy = ml.generate(model, PROMPTS, max_new_tokens=10)
    assert ml.generate(model, PROMPTS, max_new_tokens=10, temperature=1.5, top_k=1, seed=3) == greedy
    assert ml.generate(model, PROMPTS, max_new_tokens=10, temperature=1.5, top_p=1e-6, seed=3) == greedy


def sample_counts(logits: torch.Tensor, n: int = 40_000, **kw) -> torch.Tensor:
    draws = sample(logits.expand(n, -1), generator=torch.Generator().manual_seed(0), **kw)
    return torch.bincount(draws, minlength=logits.shape[-1]).double() / n


LOGITS = torch.tensor([[2.0, 0.5, -1.0, 1.5, 0.0, 1.0, -0.5, 3.0]])


def test_sample_draws_from_the_tempered_softmax():
    for temperature in (1.0, 0.7):
        want = torch.softmax(LOGITS[0].double() / temperature, dim=-1)
        assert (sample_counts(LOGITS, temperature=temperature) - want).abs().max() < 0.01


def test_top_k_and_top_p_keep_the_documented_support():
    probs = torch.softmax(LOGITS[0].double(), dim=-1).tolist()
    order = sorted(range(8), key=lambda i: -probs[i])
    top3 = order[:3]
    freq = sample_counts(LOGITS, temperature=1.0, top_k=3)
    assert set(torch.nonzero(freq).flatten().tolist()) == set(top3)
    mass = sum(probs[i] for i in top3)
    assert max(abs(freq[i].item() - probs[i] / mass) for i in top3) < 0.01
    # nucleus: the most probable tokens while the mass before each is below top_p
    top_p, kept, before = 0.6, [], 0.0
    for i in order:
        if before > top_p:
            break
        kept.append(i)
        before += probs[i]
    freq = sample_counts(LOGITS, temperature=1.0, top_p=top_p)
    assert set(torch.nonzero(freq).flatten().tolist()) == set(kept)
    assert len(kept) < 8


def test_stop_tokens_end_each_row(model):
    free = ml.generate(model, PROMPTS, max_new_tokens=12)
    stop = free[0][3]  # the 4th token row 0 produces
    stopped = ml.generate(model, PROMPTS, max_new_tokens=12, stop_tokens=[stop])
    for row, full in zip(stopped, free):
        want = full[: full.index(stop)] if stop in full else full
        assert row == want
    assert stopped[0] == free[0][: free[0].index(stop)]
    assert (
        list(ml.generate(model, [PROMPTS[0]], max_new_tokens=12, stop_tokens=[stop], stream=True))
        == stopped[0]
    )


def test_stream_of_ids_equals_the_list(model):
    (row,) = ml.generate(model, [PROMPTS[2]], max_new_tokens=9)
    assert list(ml.generate(model, [PROMPTS[2]], max_new_tokens=9, stream=True)) == row


def test_cache_is_reused_when_it_fits(model):
    model.setup_cache(4, 64)
    out = ml.generate(model, PROMPTS, max_new_tokens=8)
    assert model.cache_shape == (4, 64)
    model.clear_cache()
    assert ml.generate(model, PROMPTS, max_new_tokens=8) == out


@pytest.fixture(scope="module")
def vocab_model():
    """A small model over the real Llama 3 vocabulary, so the tokenizer can decode what it emits."""
    return random_model(
        ml.ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=128)
    )


def test_text_prompts_and_stream_pieces_join_to_the_decode(vocab_model, tokenizer):
    kw = {"max_new_tokens": 24, "temperature": 1.0, "seed": 5, "stop_tokens": ()}
    (ids,) = ml.generate(vocab_model, ["Once upon a time"], tokenizer=tokenizer, **kw)
    assert ml.generate(vocab_model, [tokenizer.encode("Once upon a time", bos=True)], **kw) == [ids]
    pieces = list(ml.generate(vocab_model, ["Once upon a time"], tokenizer=tokenizer, stream=True, **kw))
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == tokenizer.decode(ids)


def chain_model(chain: list[int]) -> ml.Transformer:
    """A model whose greedy continuation of chain[0] is chain[1:]: the blocks add nothing (wo = w2 = 0),
    token chain[i] embeds as the unit vector e_i, and the head maps e_i to chain[i + 1]."""
    args = ml.ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=64)
    assert len(set(chain)) == len(chain) and len(chain) <= args.dim
    model = random_model(args)
    with torch.no_grad():
        model.layers[0].attention.wo.weight.zero_()
        model.layers[0].feed_forward.w2.weight.zero_()
        model.tok_embeddings.weight.zero_()
        model.output.weight.zero_()
        model.norm.weight.fill_(1.0)
        for i, token in enumerate(chain):
            model.tok_embeddings.weight[token, i] = 1.0
            if i + 1 < len(chain):
                model.output.weight[chain[i + 1], i] = 1.0
    return model


def test_stream_never_splits_a_character(tokenizer):
    text = "🦙 llama 日本語"
    ids = tokenizer.encode(text)
    split = [i for i in ids if "\ufffd" in tokenizer.token_bytes(i).decode("utf-8", errors="replace")]
    assert len(split) >= 3  # the emoji's bytes are spread over several tokens
    model = chain_model([tokenizer.bos_id, *ids, tokenizer.eot_id])
    pieces = list(
        ml.generate(
            model, [[tokenizer.bos_id]], max_new_tokens=len(ids) + 5, tokenizer=tokenizer, stream=True
        )
    )
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len(pieces) < len(ids)  # partial characters were held back
    # the tokenizer's stop tokens are the default: the row ends at <|eot_id|>
    assert ml.generate(model, [[tokenizer.bos_id]], max_new_tokens=len(ids) + 5, tokenizer=tokenizer) == [ids]


def test_prompt_longer_than_the_cache(model):
    with pytest.raises(
        ValueError, match=r"prompt of 300 tokens \+ 1 new tokens needs 300 .* max_seq_len=256"
    ):
        ml.generate(model, [[1] * 300], max_new_tokens=1)
    with pytest.raises(ValueError, match=r"needs 20 cache positions, more than max_seq_len=16"):
        ml.generate(model, [[1] * 11], max_new_tokens=10, max_seq_len=16)
    with pytest.raises(ValueError, match=r"needs 20 cache positions"):
        ml.generate(
            model, [[1] * 11], max_new_tokens=10, max_seq_len=16, stream=True
        )  # raises before iterating


def test_the_overflow_message_says_how_many_tokens_to_cut(model):
    # 11 + 10 - 1 = 20 positions in 16: a prompt of 7 (7 + 10 - 1 = 16) or 6 new tokens (11 + 6 - 1 = 16);
    # each fix, applied, runs
    with pytest.raises(ValueError) as error:
        ml.generate(model, [[1] * 11], max_new_tokens=10, max_seq_len=16)
    message = str(error.value)
    assert "cut the prompt by 4 tokens (to 7)" in message and "lower max_new_tokens to 6" in message
    assert "pass a larger max_seq_len (up to the model's 256)" in message
    assert len(ml.generate(model, [[1] * 7], max_new_tokens=10, max_seq_len=16)[0]) == 10
    assert len(ml.generate(model, [[1] * 11], max_new_tokens=6, max_seq_len=16)[0]) == 6
    # a prompt longer than the whole context: only cutting it helps, and 0 new tokens is never suggested
    with pytest.raises(ValueError, match=r"cut the prompt by 52 tokens \(to 248\)$"):
        ml.generate(model, [[1] * 300], max_new_tokens=9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompts": [1, 2, 3]}, "list of prompts"),
        ({"prompts": []}, "prompts is empty"),
        ({"prompts": [[1], []]}, "prompt 1 is empty"),
        ({"prompts": ["hello"]}, "pass tokenizer="),
        ({"prompts": [[1, 300]]}, r"prompt 0 has token ids outside 0\.\.299"),
        ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),
        ({"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
        ({"top_k": 0}, "top_k=0 must be at least 1"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be at least 1"),
        ({"stream": True}, "stream=True decodes one prompt; got 3"),
    ],
)
def test_bad_arguments(model, kwargs, message):
    kwargs = {"prompts": PROMPTS, **kwargs}
    with pytest.raises(ValueError, match=message):
        ml.generate(model, **kwargs)


def test_a_replacement_decode_step_is_used(model):
    calls = []

    def step(*args, **kwargs):
        calls.append(1)
        return decode_one_token(*args, **kwargs)

    out = ml.generate(model, PROMPTS, max_new_tokens=7, decode_step=step)
    assert out == ml.generate(model, PROMPTS, max_new_tokens=7)
    assert len(calls) == 6  # the first new token comes from prefill


def test_seed_none_samples_from_the_global_generator(model):
    kw = {"max_new_tokens": 12, "temperature": 1.0, "seed": None}
    torch.manual_seed(11)
    a = ml.generate(model, PROMPTS, **kw)
    torch.manual_seed(11)
    assert ml.generate(model, PROMPTS, **kw) == a


@pytest.mark.parametrize("vocab", [300, 8192, 128_256])
def test_two_pass_argmax_is_torch_argmax_ties_and_nan_included(vocab):
    from minillama.generate import argmax

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, vocab, generator=g)
    x[1] = 0.0  # every entry tied: the first index
    x[2, [vocab // 3, vocab // 2, vocab - 1]] = 9.0  # three tied maxima in different chunks
    x[3, 7:9] = 5.0  # tied neighbours inside one chunk
    x[4, [vocab // 2, vocab - 3]] = float("nan")  # NaN counts as the largest, as in torch.argmax
    x[5] = float("-inf")
    x[5, vocab - 1] = -1e30
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    assert argmax(x)[2] == vocab // 3 and argmax(x)[4] == vocab // 2
    y = torch.randn(3, vocab, generator=g).bfloat16()  # bf16 rounding makes ties common
    assert torch.equal(argmax(y), y.argmax(dim=-1))
