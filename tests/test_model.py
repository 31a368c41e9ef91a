"""The whole model against the two oracles, and against itself (cached == uncached)."""

import pytest
import torch
from conftest import CONFIGS, random_model, rel_err, to_hf, to_meta_reference

import minillama as ml


def cached_logits(model, tokens, split):
    """Prefill tokens[:, :split], then decode the rest one position at a time."""
    b, t = tokens.shape
    model.setup_cache(b, t)
    out = [model(tokens[:, :split], start_pos=0)]
    out += [model(tokens[:, i : i + 1], start_pos=i) for i in range(split, t)]
    model.clear_cache()
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("name", CONFIGS)
def test_matches_hugging_face(name, note):
    model = random_model(CONFIGS[name])
    hf = to_hf(model)
    tokens = torch.randint(0, model.args.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)
        theirs = hf(tokens).logits
        assert note("transformers, full", rel_err(ours, theirs)) < 1e-5
        assert note("transformers, cached", rel_err(cached_logits(model, tokens, 17), theirs)) < 1e-5


@pytest.mark.parametrize("name", ["gqa4", "mqa"])
def test_matches_meta_reference(name, model_parallel, note):
    model = random_model(CONFIGS[name])
    ref = to_meta_reference(model)
    tokens = torch.randint(0, model.args.vocab_size, (3, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = ref(tokens, start_pos=0)
        assert note("Meta reference, full", rel_err(model(tokens), theirs)) < 1e-5
        # the reference's own cached decode against ours
        theirs_cached = [ref(tokens[:, :20], start_pos=0)] + [
            ref(tokens[:, i : i + 1], i) for i in range(20, 33)
        ]
        assert (
            note(
                "Meta reference, cached",
                rel_err(cached_logits(model, tokens, 20), torch.cat(theirs_cached, 1)),
            )
            < 1e-5
        )


def test_scaled_rope_matters_at_long_positions():
    # at 2,000+ positions the scaled low frequencies change the logits well beyond rounding:
    # a model with use_scaled_rope switched off must not pass as HF's llama3 model
    args = CONFIGS["gqa4"].replace(max_seq_len=4096)
    model = random_model(args)
    hf = to_hf(model)
    unscaled = random_model(args.replace(use_scaled_rope=False))
    tokens = torch.randint(0, args.vocab_size, (1, 3000), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(tokens).logits[:, -8:]
        assert rel_err(model(tokens, logits_at=None)[:, -8:], theirs) < 1e-5
        assert rel_err(unscaled(tokens)[:, -8:], theirs) > 1e-3


def test_cached_decode_equals_full_forward_with_tensor_positions():
    model = random_model(ml.MODELS["tiny"].replace(vocab_size=512, max_seq_len=64))
    tokens = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        model.setup_cache(2, 64)  # a cache longer than the sequence: unwritten rows must stay masked
        out = [model(tokens[:, :9], start_pos=torch.tensor(0))]
        out += [model(tokens[:, i : i + 1], start_pos=torch.tensor(i)) for i in range(9, 24)]
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=0, atol=1e-5 * full.abs().max().item())


def test_per_row_start_positions_match_each_row_alone():
    model = random_model(CONFIGS["gqa4"])
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, 300, (1, 7), generator=g), torch.randint(0, 300, (1, 12), generator=g)
    with torch.no_grad():
        alone = [model(a)[0, -1], model(b)[0, -1]]
        model.setup_cache(2, 32)
        padded = torch.cat([torch.nn.functional.pad(a, (0, 5)), b])
        last = model(padded, start_pos=0, logits_at=torch.tensor([6, 11]))[:, 0]
        nxt = torch.tensor([[3], [4]])
        step = model(nxt, start_pos=torch.tensor([7, 12]))[:, 0]
        alone_next = [model(torch.cat([a, nxt[:1]], 1))[0, -1], model(torch.cat([b, nxt[1:]], 1))[0, -1]]
    for i in range(2):
        torch.testing.assert_close(last[i], alone[i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step[i], alone_next[i], rtol=1e-5, atol=1e-5)


def test_bf16_stays_close_to_float32():
    model = random_model(CONFIGS["gqa4"])
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = model(tokens)
        low = model.to(torch.bfloat16)(tokens)
    assert low.dtype == torch.float32  # logits come out in float32, as Meta's
    assert model.rope.cos.dtype == torch.float32  # .to(bf16) must not round the rotary tables
    assert rel_err(low, ref) < 5e-2
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_the_model_trains():
    torch.manual_seed(0)
    args = CONFIGS["gqa4"]
    model = ml.Transformer(args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, args.vocab_size, (4, 33), generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(30):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_decode_step_compiles_once_for_all_positions():
    # a tensor start_pos keeps Python out of the step: dynamo traces one graph with no breaks
    # (fullgraph=True) and never recompiles as the position advances
    import torch._dynamo

    model = random_model(CONFIGS["gqa4"])
    model.setup_cache(1, 64)
    torch._dynamo.reset()
    counts = {"n": 0}

    def backend(gm, example_inputs):
        counts["n"] += 1
        return gm.forward

    step = torch.compile(lambda tok, pos: model(tok, start_pos=pos), backend=backend, fullgraph=True)
    with torch.no_grad():
        for p in range(10):
            step(torch.tensor([[p + 1]]), torch.tensor(p))
    assert counts["n"] == 1


def test_meta_device_builds_every_size():
    for name in ml.MODELS:
        with torch.device("meta"):
            model = ml.Transformer(ml.MODELS[name])
        assert sum(p.numel() for p in model.parameters()) == ml.count_parameters(ml.MODELS[name]).total


def test_tied_head_is_one_parameter_and_trains_as_one():
    model = random_model(CONFIGS["llama-3.2-1b-shrunk"])
    assert model.output.weight is model.tok_embeddings.weight
    names = [name for name, _ in model.named_parameters()]
    assert "tok_embeddings.weight" in names and "output.weight" not in names
    assert sum(p.numel() for p in model.parameters()) == ml.count_parameters(model.args).total
    tokens = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(4))
    model(tokens).logsumexp(-1).sum().backward()  # the head's and the embedding's gradients add up in one
    assert model.tok_embeddings.weight.grad is model.output.weight.grad


def test_llama_3_2_rope_factor_32_matters():
    """The same tied weights in transformers with Llama 3.1's factor 8 give other logits at 250 positions."""
    model = random_model(CONFIGS["llama-3.2-1b-shrunk"])
    wrong = to_hf(random_model(model.args.replace(rope_scale_factor=8.0)))
    right = to_hf(model)
    tokens = torch.randint(0, 512, (1, 250), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert rel_err(model(tokens), right(tokens).logits) < 1e-5
        assert rel_err(model(tokens), wrong(tokens).logits) > 1e-3


def test_errors_name_the_problem():
    model = random_model(CONFIGS["gqa4"])
    with pytest.raises(ValueError, match="setup_cache"):
        model(torch.zeros(1, 3, dtype=torch.long), start_pos=0)
    model.setup_cache(2, 16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long), start_pos=0)
    with pytest.raises(ValueError, match="do not fit"):
        model(torch.zeros(1, 1, dtype=torch.long), start_pos=16)
    with pytest.raises(ValueError, match="batch_size=2"):
        model(torch.zeros(3, 1, dtype=torch.long), start_pos=0)
    with pytest.raises(ValueError, match="0..299"):
        model(torch.tensor([[5, 300]]), start_pos=0)
    with pytest.raises(ValueError, match="0..299"):
        model(torch.tensor([[-1]]))
    with pytest.raises(ValueError, match=r"integer tensor"):
        model(torch.zeros(3))
    with pytest.raises(ValueError, match=r"1\.\.256"):
        model.setup_cache(1, 1000)
