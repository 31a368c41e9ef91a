"""The compiled decode step (`minillama.compiled`, `generate(..., compile=True)`, `generate --compile`).

Each format's model is compiled once per session (module-scoped fixtures, a small tiny-shaped model):
max_autotune times each matrix product as Inductor's C++ template and as ATen's kernel while it
compiles, which takes tens of seconds on 2 cores. The oracle is eager decoding of the same weights."""

import re

import pytest
import torch
from torch._dynamo.utils import counters

import minillama as ml
from minillama.__main__ import _timing
from minillama.__main__ import main as cli_main
from minillama.compiled import (
    CPU_BF16_OPTIONS,
    CPU_FLOAT32_OPTIONS,
    CPU_OPTIONS,
    CompiledDecode,
    compile_decode,
)
from minillama.model import random_model

# tiny's shape with two blocks and a smaller vocabulary: every matrix kind of the real model, quick to tune
ARGS = ml.MODELS["tiny"].replace(n_layers=2, vocab_size=4096, max_seq_len=128)
PROMPTS = [[1, 17, 400, 9, 3000, 5], [2, 70]]
NEW = 12


def _model(fmt: str):
    model = random_model(ARGS, dtype=torch.float32 if fmt == "fp32" else torch.bfloat16, seed=0)
    if fmt == "int8":
        ml.quantize(model, "int8")
    elif fmt == "int4":
        ml.quantize(model, "int4", group_size=32)
    return model


@pytest.fixture(scope="module", params=["fp32", "bf16", "int8", "int4"])
def compiled(request):
    """(format, model, eager tokens, compiled tokens, graphs compiled by that first compiled call,
    the code it generated)."""
    from torch._inductor.utils import run_and_get_code

    model = _model(request.param)
    eager = [ml.generate(model, [p], max_new_tokens=NEW) for p in PROMPTS]
    before = counters["stats"]["unique_graphs"]
    first, sources = run_and_get_code(ml.generate, model, [PROMPTS[0]], max_new_tokens=NEW, compile=True)
    graphs = counters["stats"]["unique_graphs"] - before
    return request.param, model, eager, first, graphs, "\n".join(sources)


@torch.inference_mode()
def _forced_logits(model, prompt, tokens, step):
    """Logits `[n, v]` of each decode step fed `tokens[:-1]` after `prompt` (teacher-forced: both steps
    see the same inputs, whatever either would have picked)."""
    model.reset_cache()
    ml.prefill(model, torch.tensor([prompt]), torch.tensor([len(prompt)]))
    rows = []
    for i, t in enumerate(tokens[:-1]):
        _, logits = step(model, torch.tensor([[t]]), torch.tensor([len(prompt) + i]))
        rows.append(logits[0].float())
    return torch.stack(rows)


def test_same_greedy_tokens_as_eager(compiled):
    """fp32: the same tokens. 16-bit activations (bf16, and int8/int4, whose activations are bf16): the
    compiled kernels sum in another order than eager's, so the logits differ by bf16 rounding; the
    tokens must agree up to the first step where eager's two best logits lie within that rounding
    (a tie either may break), and the teacher-forced logits within it everywhere."""
    fmt, model, eager, first, graphs, _ = compiled
    assert graphs == 1, f"{fmt}: the first compiled generate compiled {graphs} graphs, not 1"
    second = ml.generate(model, [PROMPTS[1]], max_new_tokens=NEW, compile=True)
    if fmt == "fp32":
        assert first == eager[0] and second == eager[1]
        return
    for prompt, want, got in zip(PROMPTS, eager, (first, second)):
        want, got = want[0], got[0]
        ref = _forced_logits(model, prompt, want, ml.decode_one_token)
        fast = _forced_logits(model, prompt, want, compile_decode(model))
        scale = ref.std().item()
        tol = 0.05 * scale  # bf16 keeps 8 significant bits: a few roundings of ~0.4 % along the way
        assert (fast - ref).abs().max().item() < tol, (fmt, (fast - ref).abs().max().item(), scale)
        top2 = ref.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()  # margins[i]: the choice of token i + 1
        differ = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if differ is not None:
            assert differ > 0, f"{fmt}: the prefill's token differs, and the prefill is eager in both"
            assert margins[differ - 1] < 2 * tol, (fmt, differ, margins[differ - 1], tol)


def test_no_recompile_as_positions_advance_and_the_step_is_reused(compiled):
    fmt, model, eager, first, _, _ = compiled
    step = compile_decode(model)
    assert step is compile_decode(model), "the same model and options must give the cached step"
    compiles, seconds = step.compiles, step.compile_s
    assert compiles == 1 and seconds > 0, (compiles, seconds)
    graphs = counters["stats"]["unique_graphs"]
    recompiles = counters["recompiles"].copy()
    # positions 2..17 (the other prompt), then 6..17 again: the step must serve them all as compiled
    again = [ml.generate(model, [prompt], max_new_tokens=NEW, compile=True) for prompt in PROMPTS[::-1]]
    assert again[1] == first  # the same compiled step, the same tokens
    if fmt == "fp32":
        assert again[::-1] == eager
    assert counters["stats"]["unique_graphs"] == graphs, f"{fmt}: a later generate compiled again"
    assert counters["recompiles"] == recompiles
    assert (step.compiles, step.compile_s) == (compiles, seconds)


def test_each_format_gets_its_kernels(compiled):
    """The default settings per format. float32 weights get the C++ GEMM template alone: with ATen among
    the candidates, freezing turns each float32 linear into MKL's packed GEMM (`mkl._mkl_linear`), which
    autotuning kept for the large matrices although the whole fp32 step then takes about twice the
    template's time. bfloat16 weights get oneDNN's linear alone (`mkldnn._linear_pointwise`), no
    template: the template's bf16 kernel made the slower step (on a CPU without bf16 instructions
    freezing leaves them to ATen's matmul). int8 and int4 get the timing of the
    template against ATen's kernels (machine: benchmarks/results/compile-cpu.json)."""
    fmt, model, _, _, _, code = compiled
    step = compile_decode(model)
    # every format: the wrapper that calls the kernels is generated as C++ (`cpp_wrapper`), its entry
    # point a C++ function (benchmarks/results/intel-xeon-avx512/compile-cpu.json)
    assert "void inductor_entry_impl(" in code and "cpp_wrapper/cpu.h" in code, f"{fmt}: a Python wrapper"
    if fmt == "fp32":
        assert step.options == CPU_FLOAT32_OPTIONS
        assert step.options["max_autotune_gemm_backends"] == "CPP"
        assert "mkl_linear" not in code, "a float32 linear went to MKL's packed GEMM"
    elif fmt == "bf16":
        assert step.options == CPU_BF16_OPTIONS
        assert "micro_gemm" not in code, "a bf16 matrix product went to the C++ GEMM template"
        # q, k, v, o, gate, up, down in each of the 2 blocks, and the head: oneDNN's linear, or on a CPU
        # without bf16 instructions (an AVX2-only CPU; oneDNN then has no bf16 kernel) ATen's matmul
        # (called from the C++ wrapper through the shim: aoti_torch_cpu__linear_pointwise[_binary], or
        # for ATen's matmul aoti_torch_cpu_mm_out, the name a compiled bf16 torch.mm gets in torch 2.13)
        oneDNN = torch.ops.mkldnn._is_mkldnn_bf16_supported()
        kernel = r"aoti_torch_cpu__linear_pointwise\w*\(" if oneDNN else r"aoti_torch_cpu_mm_out\("
        linears = len(re.findall(kernel, code))
        assert linears >= 7 * ARGS.n_layers + 1, f"{linears} x {kernel} in the bf16 step"
        return
    else:
        assert step.options == CPU_OPTIONS
    if fmt == "int4" and not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        # the template's int4 micro-kernels need AVX-512 or AMX (torch 2.13,
        # torch/_inductor/codegen/cpp_micro_gemm.py: CppMicroGemmWoQInt4Avx512, CppMicroGemmWoQInt4Amx):
        # on an AVX2 CPU ATen's int4 kernel is the only candidate
        assert "_weight_int4pack_mm_for_cpu" in code and "micro_gemm" not in code
        return
    # fp32, int8 and int4: the template's micro-kernels (one per shape at least)
    assert code.count("micro_gemm") >= 4, f"{fmt}: no C++ GEMM template in the compiled step"


def test_the_settings_stay_scoped():
    """compile=True must not change the user's global Inductor configuration."""
    config = torch._inductor.config
    for name in CPU_OPTIONS:
        assert getattr(config, name) != CPU_OPTIONS[name], f"{name}: the default already equals ours"
    from torch._inductor.utils import run_and_get_code

    model = _model("fp32")
    step = compile_decode(model, {"freezing": True})  # cheap options: the scoping is what is tested
    model.setup_cache(1, 16)
    _, sources = run_and_get_code(step.logits, torch.tensor([[5]]), torch.tensor([0]))
    # the options did take effect: frozen weights are constants of the generated code, not its inputs
    assert "_frozen_param" in "\n".join(sources)
    assert step.compiles == 1
    for name in CPU_OPTIONS:
        assert getattr(config, name) != CPU_OPTIONS[name], f"compiling changed the global {name}"


def test_changed_weights_compile_afresh():
    """The weights are frozen into the compiled step: after an in-place change or a quantisation the
    cached step must not be reused (stale constants would decode with the old weights)."""
    model = _model("fp32")
    options = {"freezing": True}
    step = compile_decode(model, options)
    prompt = [PROMPTS[0]]
    ml.generate(model, prompt, max_new_tokens=NEW, decode_step=step)
    assert compile_decode(model, options) is step
    with torch.no_grad():
        model.output.weight.mul_(-1.0)  # reverses every logit's ranking: other tokens
    fresh = compile_decode(model, options)
    assert fresh is not step
    want = ml.generate(model, prompt, max_new_tokens=NEW)
    assert ml.generate(model, prompt, max_new_tokens=NEW, decode_step=fresh) == want
    ml.quantize(model, "int8")
    assert compile_decode(model, options) is not fresh


def test_a_seeded_sample_matches_eager():
    """Sampling runs outside the compiled graph, so a seeded generator works as in eager decoding."""
    model = _model("fp32")
    step = compile_decode(model, {"freezing": True})
    kw = {"max_new_tokens": 8, "temperature": 0.8, "top_k": 50, "seed": 3}
    assert ml.generate(model, PROMPTS, decode_step=step, **kw) == ml.generate(model, PROMPTS, **kw)


def test_bad_input_is_a_clear_error():
    model = _model("fp32")
    other = _model("fp32")
    with pytest.raises(ValueError, match="speculative decoding"):
        ml.generate(model, PROMPTS, compile=True, draft=other)
    with pytest.raises(ValueError, match="either decode_step= or compile="):
        ml.generate(model, PROMPTS, compile=True, decode_step=ml.decode_one_token)
    with pytest.raises(ValueError, match="pass True"):
        ml.generate(model, PROMPTS, compile="fast")
    with pytest.raises(ValueError, match="minillama Transformer"):
        compile_decode(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="dict of torch._inductor.config"):
        compile_decode(model, "max-autotune")
    step = CompiledDecode(model, {})
    with pytest.raises(ValueError, match="belongs to another model"):
        step(other, torch.tensor([[1]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="pos must be a tensor"):
        step.logits(torch.tensor([[1]]), 0)
    assert step.compiles == 0


def test_a_copy_of_the_model_does_not_share_its_steps():
    import copy

    model = _model("fp32")
    step = compile_decode(model, {"freezing": True})
    clone = copy.deepcopy(model)
    assert compile_decode(clone, {"freezing": True}) is not step


def test_cli_compile_with_tp_is_a_usage_error(capsys):
    code = cli_main(["generate", "--model", "tiny", "--prompt", "hi", "--compile", "--tp", "2"])
    assert code == 2
    assert "--compile is not available with --tp" in capsys.readouterr().err


def test_cli_timing_line_keeps_the_compiling_step_apart():
    class Step:  # what _timing reads of a compiled step
        compiles, compile_s = 1, 30.0

    # prefill 0.5 s; first decode step 30 s (compiling); then 4 steps of 0.1 s
    arrivals = [10.5, 40.5, 40.6, 40.7, 40.8, 40.9]
    line = "; ".join(_timing(10.0, arrivals, 20, Step()))
    assert "prefill 20 tokens in 500 ms (40.0 tok/s)" in line
    assert "compiled in 30.0 s" in line
    assert "decode 4 tokens at 10.0 tok/s" in line
    eager = "; ".join(_timing(10.0, arrivals[:1] + [10.6, 10.7], 20, None))
    assert "compiled" not in eager and "decode 2 tokens at 10.0 tok/s" in eager
