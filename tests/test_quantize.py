"""Weight-only quantisation: each format's error bound per channel/group, the kernels against the
pure-PyTorch path and against a plain model holding the dequantised weights, compile, save/load,
ragged generation with a quantised head, the byte accounting against real tensors, clear errors."""

import pytest
import torch
from conftest import random_model, rel_err

import minillama as ml
from minillama.generate import decode_one_token
from minillama.quantize import (
    GROUP_SIZES,
    Int4Linear,
    Int8Linear,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
    use_kernels,
)

# every matrix has a multiple of 16 outputs, so the CPU int4 kernel serves them all;
# inputs are 128 (dim, wo) and 384 (w2): group sizes 32, 64, 128 divide both, 256 neither
ARGS = ml.ModelArgs(
    dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=128, max_seq_len=64
)
FORMATS = [("int8", None), ("int4", 32), ("int4", 128)]
PROMPTS = [[5, 17, 240], [1, 2, 3, 4, 5, 6, 7, 8, 9], [511, 0, 42, 42, 7]]


def weights(dtype=torch.float32, rows=48, cols=256, seed=0):
    """Rows of very different scales, one of them all zeros, one with an outlier."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 1, rows)[:, None]
    w[3] = 0.0
    w[5, 7] = 40.0
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_error_is_at_most_half_a_step_per_channel(dtype):
    w = weights(dtype)
    codes, scales = quantize_int8(w)
    assert codes.dtype == torch.int8 and scales.shape == (w.shape[0],) and scales.dtype == dtype
    err = (dequantize_int8(codes, scales) - w.float()).abs().amax(dim=1)
    assert (err <= scales.float() / 2 * (1 + 1e-6)).all(), (err / scales.float()).max().item()
    assert codes.abs().amax(dim=1)[w.float().abs().amax(dim=1) > 0].min() >= 126  # the grid is used
    assert (codes[3] == 0).all()


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_int4_error_is_at_most_half_a_step_per_group(group_size):
    w = weights(torch.float32)
    codes, scales, zeros = quantize_int4(w, group_size)
    assert codes.max() <= 15 and scales.shape == (w.shape[0], w.shape[1] // group_size)
    err = (dequantize_int4(codes, scales, zeros) - w).abs()
    err = err.view(w.shape[0], -1, group_size).amax(dim=-1)
    # fp32 scales and zeros: the bound up to the float32 rounding of the zero and the step
    slack = 1e-6 * (zeros.abs() + 8 * scales)
    assert (err <= scales / 2 * (1 + 1e-6) + slack).all(), (err / scales).max().item()


def test_int4_codes_pack_two_per_byte():
    codes = torch.randint(0, 16, (32, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    packed = pack_int4(codes)
    assert packed.shape == (32, 32) and packed.dtype == torch.uint8
    assert packed[0, 0].item() == codes[0, 0].item() * 16 + codes[0, 1].item()
    assert torch.equal(unpack_int4(packed), codes)


def dequantized_copy(model):
    """A plain model (nn.Linear everywhere) holding the dequantised weights of `model`'s layers."""
    plain = ml.Transformer(model.args).to(model.tok_embeddings.weight.dtype)
    state = {}
    for name, m in model.named_modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            state[f"{name}.weight"] = m.dequantize().to(plain.tok_embeddings.weight.dtype)
    state.update({k: v for k, v in model.state_dict().items() if k not in state and k.endswith("weight")})
    plain.load_state_dict(state)
    return plain.eval()


@pytest.mark.parametrize("fmt,group_size", FORMATS)
def test_kernels_match_the_reference_path_and_the_dequantised_model(fmt, group_size):
    tokens = torch.randint(0, ARGS.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)]:
        model = ml.quantize(random_model(ARGS).to(dtype), fmt, group_size=group_size)
        assert all(
            m.kernel and getattr(m, "packed", 1) is not None for m in model.modules() if hasattr(m, "kernel")
        )
        with torch.no_grad():
            fast = model(tokens)
            reference = use_kernels(model, False)(tokens)
            plain = dequantized_copy(model)(tokens)
        assert rel_err(fast, reference) < tol, (dtype, rel_err(fast, reference))
        assert rel_err(fast, plain) < tol, (dtype, rel_err(fast, plain))


@pytest.mark.parametrize("fmt,group_size", FORMATS)
def test_quantised_logits_stay_near_the_16_bit_ones(fmt, group_size):
    # random weights overstate the error (flat logits); the bound here is loose on purpose
    tokens = torch.randint(0, ARGS.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    model = random_model(ARGS)
    with torch.no_grad():
        before = model(tokens)
        after = ml.quantize(model, fmt, group_size=group_size)(tokens)
    err = ((after - before).norm() / before.norm()).item()
    assert err < (0.03 if fmt == "int8" else 0.4), err


def _parted_only_at_near_ties(model, eager_out, compiled_out, tol=2e-2):
    """Greedy bf16 tokens of two kernel choices may part where two random-weight logits almost tie (the
    compiled int8 step rounds differently on an AVX2 CPU than on an AVX-512 one): where a sequence parts,
    the two chosen tokens' logits must be within `tol` of the largest logit, by a full eager forward."""
    parted = 0
    for prompt, e, c in zip(PROMPTS, eager_out, compiled_out, strict=True):
        j = next((i for i, (a, b) in enumerate(zip(e, c, strict=True)) if a != b), None)
        if j is None:
            continue
        parted += 1
        with torch.no_grad():
            logits = model(torch.tensor([prompt + e[:j]]))[0, -1].float()
        gap = (logits[e[j]] - logits[c[j]]).abs().item()
        assert gap <= tol * logits.abs().max().item(), (prompt, j, e[j], c[j], gap)
    assert parted <= 1, f"{parted} of {len(PROMPTS)} sequences parted: more than rounding at a near tie"


def test_compiled_int8_equals_eager_and_never_recompiles():
    # bf16 activations: Inductor runs the int8 layers as _weight_int8pack_mm; the step is one graph
    import torch._dynamo
    from torch._inductor.compile_fx import compile_fx

    model = ml.quantize(random_model(ARGS.replace(n_layers=1)).to(torch.bfloat16), "int8")
    use_kernels(model, False)  # gpt-fast's formulation: the pattern Inductor rewrites
    torch._dynamo.reset()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return compile_fx(gm, example_inputs)

    step = torch.compile(decode_one_token, backend=backend, fullgraph=True)
    eager_out = ml.generate(model, PROMPTS, max_new_tokens=6)
    compiled_out = ml.generate(model, PROMPTS, max_new_tokens=6, decode_step=step)
    _parted_only_at_near_ties(model, eager_out, compiled_out)
    assert len(compiles) == 1
    model.reset_cache()
    sampling = {"temperature": 0.0, "top_k": None, "top_p": 1.0, "generator": None}  # as generate passes them
    with torch.inference_mode():  # tensors made here, as generate makes them (else a guard on pos fails)
        token, pos = torch.tensor([[3]] * 3), torch.tensor([4, 9, 5])
        a, b = step(model, token, pos, **sampling)[1], decode_one_token(model, token, pos, **sampling)[1]
    assert rel_err(a, b) < 2e-2
    assert len(compiles) == 1


def test_int4_step_is_one_graph():
    import torch._dynamo

    model = ml.quantize(random_model(ARGS).to(torch.bfloat16), "int4", group_size=64)
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = torch.compile(decode_one_token, backend=backend, fullgraph=True)
    assert ml.generate(model, PROMPTS, max_new_tokens=5, decode_step=step) == ml.generate(
        model, PROMPTS, max_new_tokens=5
    )
    assert len(graphs) == 1
    assert "_weight_int4pack_mm_for_cpu" in graphs[0].code


@pytest.mark.parametrize("fmt,group_size", [("int8", None), ("int4", 64)])
def test_save_load_round_trip(tmp_path, fmt, group_size):
    model = ml.quantize(random_model(ARGS).to(torch.bfloat16), fmt, group_size=group_size, head=False)
    ml.save(model, tmp_path)
    loaded = ml.load(tmp_path, progress=False)
    assert loaded.quantization == model.quantization
    assert isinstance(loaded.output, torch.nn.Linear)  # head=False kept the head 16-bit
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    tokens = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        assert torch.equal(model(tokens), loaded(tokens))


@pytest.mark.parametrize("fmt,group_size", [("int8", None), ("int4", 32)])
def test_ragged_greedy_generate_with_a_quantised_head(fmt, group_size):
    model = ml.quantize(random_model(ARGS).to(torch.bfloat16), fmt, group_size=group_size)
    assert not model.output.weight.is_floating_point()
    batched = ml.generate(model, PROMPTS, max_new_tokens=8)
    # the cache follows the activations, not the head's integer codes
    assert model.layers[0].attention.cache.k.dtype == torch.bfloat16
    alone = [ml.generate(model, [p], max_new_tokens=8)[0] for p in PROMPTS]
    assert batched == alone and all(len(r) == 8 for r in batched)


@pytest.mark.parametrize(
    "fmt,group_size,head", [("int8", None, True), ("int4", 64, True), ("int4", 128, False)]
)
def test_weight_bytes_count_the_real_tensors(fmt, group_size, head):
    model = ml.quantize(random_model(ARGS).to(torch.bfloat16), fmt, group_size=group_size, head=head)
    stored = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert ml.weight_bytes(ARGS, 2, fmt, group_size, head) == stored


def test_accounting_of_the_published_sizes():
    b8, b70 = ml.MODELS["llama-3.1-8b"], ml.MODELS["llama-3.1-70b"]
    bf16 = ml.weight_bytes(b8, 2)
    int8, int4 = ml.weight_bytes(b8, 2, "int8"), ml.weight_bytes(b8, 2, "int4", 128)
    # int8: the linears at 1 byte + a scale per row; embedding and norms stay 16-bit
    linears = ml.count_parameters(b8).total - ml.count_parameters(b8).embedding - 65 * 4096
    assert bf16 - int8 == linears - 2 * sum(o * n for o, _, n in ml.accounting._linears(b8))
    assert int4 < int8 < bf16
    # the 70B's weights: 141 GB in bf16, 71.6 GB in int8, 39.0 GB in int4 (g128): half an 80 GB card
    assert (
        ml.weight_bytes(b70, 2, "int4", 128)
        < 40e9
        < ml.weight_bytes(b70, 2, "int8")
        < 80e9
        < ml.weight_bytes(b70)
    )
    step = ml.decode_step_bytes(b8, context=0, format="int8")
    assert step == int8 - 2 * (ml.count_parameters(b8).embedding - 4096)


def test_errors_name_the_problem():
    model = random_model(ARGS)
    with pytest.raises(ValueError, match="unknown format 'int3'"):
        ml.quantize(model, "int3")
    with pytest.raises(ValueError, match="group_size=48 is not one the int4 kernels take"):
        ml.quantize(model, "int4", group_size=48)
    with pytest.raises(
        ValueError, match=r"group_size=256 does not divide the 128 inputs of layers\.0\.attention\.wq"
    ):
        ml.quantize(model, "int4", group_size=256)
    with pytest.raises(ValueError, match="leave group_size out"):
        ml.quantize(model, "int8", group_size=64)
    with pytest.raises(ValueError, match="torch.float64 weights"):
        ml.quantize(random_model(ARGS).double(), "int8")
    with pytest.raises(ValueError, match="unknown backend"):
        ml.quantize(model, "int8", backend="bitsandbytes")
    assert all(
        isinstance(m, torch.nn.Linear) for m in [model.output, model.layers[0].attention.wq]
    )  # untouched
    ml.quantize(model, "int8")
    with pytest.raises(ValueError, match="already quantised"):
        ml.quantize(model, "int4")
    with pytest.raises(ValueError, match="does not divide 100 inputs"):
        ml.accounting.linear_bytes(8, 100, "int4", 32)


def test_quantize_int4_names_a_group_size_that_does_not_divide_the_inputs():
    # SmolLM2's 1,536 x 576 feed-forward: 576 inputs split into groups of 64 but not of 128
    w = torch.randn(1536, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"576 inputs are not a multiple of 128.*group_size that divides"):
        quantize_int4(w, 128)
    with pytest.raises(ValueError, match=r"shape \(576,\)"):
        quantize_int4(w[0], 64)  # a single row is not an [out, in] weight
    codes, scales, zeros = quantize_int4(w, 64)
    assert codes.shape == (1536, 576) and scales.shape == zeros.shape == (1536, 576 // 64)


@pytest.mark.parametrize("fmt,group_size", [("int8", None), ("int4", 64)])
def test_torchao_backend_agrees_with_ours(fmt, group_size, tmp_path):
    pytest.importorskip("torchao")
    tokens = torch.tensor([PROMPTS[1]])
    ours = ml.quantize(random_model(ARGS).to(torch.bfloat16), fmt, group_size=group_size)
    theirs = ml.quantize(random_model(ARGS).to(torch.bfloat16), fmt, group_size=group_size, backend="torchao")
    assert type(theirs.output.weight).__name__ == ("Int8Tensor" if fmt == "int8" else "Int4OpaqueTensor")
    # the same recipe: each layer's weights, read back through torchao's own matmul, land on our grid
    # (a code may differ by one step where the two round a tie or a scale differently)
    for name, layer in ours.named_modules():
        if isinstance(layer, (Int8Linear, Int4Linear)):
            w = theirs.get_submodule(name).weight
            with torch.no_grad():
                read_back = (
                    torch.nn.functional.linear(torch.eye(w.shape[1], dtype=torch.bfloat16), w).float().T
                )
            mine = layer.dequantize()
            step = (
                layer.scales.float()[:, None]
                if fmt == "int8"
                else layer.scales.float().repeat_interleave(group_size, 1)
            )
            assert ((read_back - mine).abs() <= 1.1 * step).all(), name
    with torch.no_grad():
        assert rel_err(theirs(tokens), ours(tokens)) < 0.2
    assert ml.generate(theirs, PROMPTS, max_new_tokens=3)  # the cache dtype, the device: both fine
    with pytest.raises(ValueError, match="backend='minillama' to save"):
        ml.save(theirs, tmp_path)


def test_bench_quantised_variants_count_their_own_bytes():
    from minillama.bench import QUANTISED, run

    assert {"int8", "int4-g128", "torchao-int8"} <= set(QUANTISED)
    results = run(ARGS, batches=(1,), prompt_len=4, new_tokens=3, dtype="bfloat16", repeats=1,
                  variants="static,int8,int4-g64", ceilings=False)  # fmt: skip
    runs = {r["variant"]: r for r in results["runs"]}
    assert runs["int8"]["format"] == "int8" and runs["int4-g64"]["group_size"] == 64
    for v, fmt, g in [("static", None, 128), ("int8", "int8", 128), ("int4-g64", "int4", 64)]:
        assert runs[v]["bytes_per_step"] == ml.decode_step_bytes(ARGS, runs[v]["context"], 1, 2, fmt, g)
    assert (
        runs["int4-g64"]["bytes_per_step"] < runs["int8"]["bytes_per_step"] < runs["static"]["bytes_per_step"]
    )
    assert "error" not in runs["int8"] and runs["int8"]["decode_ms_per_token"] > 0
    # the CPU ceiling (the 16-bit matvec) is scaled to the variant's bytes
    scale = runs["static"]["bytes_per_step"] / runs["int8"]["bytes_per_step"]
    assert runs["int8"]["roofline_tok_s"] == pytest.approx(1e3 / runs["int8"]["matvec_ms"] * scale)


def test_cards_show_quantised_bytes_when_a_format_is_given():
    a = ml.MODELS["llama-3.1-8b"]
    plain, quantised = ml.card("model", a), ml.card("model", a, format="int4", group_size=64)
    assert "decode_step_bytes_quantised" not in plain.facts
    assert quantised.facts["decode_step_bytes_quantised"] == ml.decode_step_bytes(
        a, 1001, format="int4", group_size=64
    )
    rows = dict(ml.card("block", a, format="int8").numbers[0].rows)
    assert (
        rows["Weights · int8 (+ a scale per row)"] == "208.1 MiB"
    )  # 218,103,808 codes + 43,008 row scales · 2 B + 8,192 gains · 2 B
    with pytest.raises(ValueError, match="unknown format 'int3'"):
        ml.card("model", a, format="int3")


@pytest.mark.parametrize("fmt,extra", [("int8", []), ("int4", ["--group-size", "32"])])
def test_cli_generate_quantize(tmp_path, capsys, fmt, extra):
    from minillama.__main__ import main

    args = ml.ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=64)
    model = random_model(args)
    ml.save(model, tmp_path)
    tok = ml.Tokenizer.default()
    want = ml.generate(ml.quantize(model, fmt, group_size=32 if fmt == "int4" else None), ["hi"],
                       max_new_tokens=5, tokenizer=tok)[0]  # fmt: skip
    code = main(["generate", "--checkpoint", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "5",
                 "--temperature", "0", "--quiet", "--quantize", fmt, *extra])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out == tok.decode(want) + "\n"
    assert f"{fmt}{' g32' if fmt == 'int4' else ''} weights" in out.err


def test_a_tied_head_quantised_is_a_copy_beside_the_16_bit_embedding():
    tied = ARGS.replace(tie_embeddings=True)
    model = ml.quantize(random_model(tied).to(torch.bfloat16), "int8")
    assert model.output.weight is not model.tok_embeddings.weight and model.output.weight.dtype == torch.int8
    stored = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert ml.weight_bytes(tied, 2, "int8") == stored
    # the step reads the quantised head in full and only the batch's rows of the embedding
    assert ml.decode_step_bytes(tied, 0, format="int8") == stored - 2 * (ARGS.vocab_size - 1) * ARGS.dim
    assert ml.generate(model, PROMPTS, max_new_tokens=3)
