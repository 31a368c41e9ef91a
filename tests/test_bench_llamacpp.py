"""llama.cpp as the benchmark's peer (`minillama/bench/llamacpp.py`): without llama-cpp-python the command
says how to install it; the row comparison is checked on hand-made numbers; with llama-cpp-python, one short
run on a small model written as GGUF is checked for what the chapters read (no timing is asserted: a
shared, noisy machine)."""

import sys

import pytest
import torch
from conftest import random_model
from test_gguf import smol_path  # noqa: F401 (a fixture)
from test_write_gguf import smol_shaped

import minillama as ml
from minillama import save_gguf
from minillama.bench import llamacpp
from minillama.bench.cli import main


def test_without_llama_cpp_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    assert main(["--peer", "llamacpp", "--no-save"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'minillama[llamacpp]'" in err and "llama-cpp-python==0.3.36" in err
    assert err.count("\n") == 1


def test_leading_agreement_counts_tokens_before_the_first_difference():
    assert llamacpp.leading_agreement([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert llamacpp.leading_agreement([5, 6], [5, 6]) == 2
    assert llamacpp.leading_agreement([1], [2]) == 0


def run_entry(impl, variant, row, per_token_ms, tokens):
    return {"impl": impl, "variant": variant, "row": row, "decode_tok_s": 1e3 / sorted(per_token_ms)[1],
            "times_ms": {"decode_per_token": per_token_ms}, "tokens": tokens}  # fmt: skip


def test_rows_pair_the_fastest_of_each_engine():
    results = {
        "config": {"rows": ["32-bit", "4-bit"]},
        "runs": [
            run_entry("llama.cpp", "F32", "32-bit", [20.0, 25.0, 30.0], [1, 2, 3]),
            run_entry("minillama", "fp32", "32-bit", [80.0, 100.0, 60.0], [1, 2, 3]),
            run_entry("minillama", "fp32-compiled", "32-bit", [40.0, 50.0, 45.0], [1, 2, 3]),
            run_entry("llama.cpp", "Q4_0", "4-bit", [10.0, 10.0, 10.0], [1, 2, 3]),
            run_entry("llama.cpp", "Q4_1", "4-bit", [8.0, 8.0, 8.0], [1, 9, 3]),
            run_entry("minillama", "int4-g32", "4-bit", [10.0, 11.0, 12.0], [1, 9, 4]),
        ],
    }
    rows = {r["row"]: r for r in llamacpp.compare(results)}
    top = rows["32-bit"]
    assert (top["minillama"], top["llama_cpp"]) == ("fp32-compiled", "F32")
    assert top["ratio"] == pytest.approx(25 / 45)  # medians: 45 ms against 25 ms per token
    assert top["ratio_paired"] == pytest.approx(25 / 50)  # repeat by repeat: 20/40, 25/50, 30/45
    assert top["same_tokens"] and not top["met"]
    four = rows["4-bit"]
    assert (four["minillama"], four["llama_cpp"]) == ("int4-g32", "Q4_1")
    assert four["ratio"] == pytest.approx(8 / 11) and four["met"]  # the 4-bit target is 0.7
    assert not four["same_tokens"] and four["agreement"] == 2


def test_a_short_run_against_llama_cpp(tmp_path, smol_path):  # noqa: F811
    pytest.importorskip("llama_cpp", reason=llamacpp.INSTALL)
    import gguf

    vocab = len(gguf.GGUFReader(smol_path).fields["tokenizer.ggml.tokens"].data)
    args = smol_shaped(vocab).replace(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, hidden_dim=256)
    model = random_model(args)
    model.output.weight = model.tok_embeddings.weight
    path = save_gguf(model, tmp_path / "small.gguf", tokenizer=smol_path)
    seen, threads = [], torch.get_num_threads()
    results = llamacpp.run(str(path), rows=("32-bit", "8-bit"), new_tokens=6, repeats=2, threads=1,
                           gguf_dir=tmp_path, on_repeat=seen.append)  # fmt: skip
    assert [r["config"]["repeats_done"] for r in seen] == [1, 2]
    runs = {r["variant"]: r for r in results["runs"]}
    assert set(runs) == {"F32", "fp32", "Q8_0", "int8"}
    matrices = [w for n, w in model.state_dict().items() if w.dim() == 2 and n != "output.weight"]
    weights = sum(w.numel() for w in matrices)  # the tied head is the embedding, read whole
    assert runs["F32"]["weight_bytes_per_step"] == runs["fp32"]["weight_bytes_per_step"] == 4 * weights
    assert runs["Q8_0"]["bits_per_weight"] == 8.5  # 34 bytes per block of 32
    rows = sum(w.shape[0] for w in matrices)
    assert runs["int8"]["weight_bytes_per_step"] == weights + 2 * rows  # codes + a bf16 scale per row
    for r in runs.values():
        assert len(r["tokens"]) == 6 and len(r["times_ms"]["decode_per_token"]) == 2
        assert r["achieved_GBps"] == pytest.approx(r["weight_bytes_per_step"] / r["decode_ms_per_token"] / 1e6)
    assert runs["fp32"]["agrees_with_llama_cpp_f32"] == 6  # the same float32 weights: the same greedy tokens
    (top,) = [r for r in results["rows"] if r["row"] == "32-bit"]
    assert top["same_tokens"] and top["ratio"] == pytest.approx(
        runs["fp32"]["decode_tok_s"] / runs["F32"]["decode_tok_s"])  # fmt: skip
    assert results["config"]["threads"] == {"torch": 1, "llama_cpp": 1}
    assert results["ceilings"]["copy_GBps"] > 0 and set(results["ceilings"]["matvec_GBps"]) == {"fp32"}
    assert torch.get_num_threads() == threads  # the run's thread count was the run's only
    # the table's first line names the CPU's vector instructions (AVX2 and AVX-512 EPYCs share a name)
    assert f"({results['machine']['cpu_isa']})" in llamacpp.table(results).splitlines()[0]


# A stand-in for llama-cpp-python that crashes (SIGSEGV) while loading a model with llama.cpp's extra weight
# buffers on, as llama-cpp-python 0.3.36 did on Q8_0 and Q4_0 on an Intel Xeon with AMX, and works without them.
FAKE_LLAMA_CPP = {
    "__init__.py": '''
import ctypes, os, signal
from . import llama_cpp as _api
_logits = (ctypes.c_float * 8)(0, 0, 0, 5, 0, 0, 0, 0)  # the argmax is token 3

def llama_get_logits_ith(ctx, i):
    return ctypes.cast(_logits, ctypes.POINTER(ctypes.c_float))

class Llama:
    def __init__(self, path, **kwargs):
        if _api.llama_model_default_params().use_extra_bufts:
            os.kill(os.getpid(), signal.SIGSEGV)
        self.ctx = None
    def n_vocab(self): return 8
    def reset(self): pass
    def eval(self, tokens): pass
''',
    "llama_cpp.py": '''
import types
def llama_model_default_params():
    return types.SimpleNamespace(use_extra_bufts=True)
''',
}


@pytest.fixture
def crashing_llama_cpp(tmp_path, monkeypatch):
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    for name, text in FAKE_LLAMA_CPP.items():
        (package / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))  # the probe's child imports this one
    return tmp_path / "model-Q8_0.gguf"


def test_a_llama_cpp_crash_is_caught_and_the_file_runs_without_extra_buffers(crashing_llama_cpp):
    said = []
    extra, why = llamacpp.usable_extra_bufts(crashing_llama_cpp, 1, [1, 2, 3], said.append)
    assert extra is False
    assert "killed by signal 11" in why and "without them" in why
    assert said and "model-Q8_0.gguf" in said[0] and "trying without them" in said[0]


def test_a_file_llama_cpp_cannot_run_at_all_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no llama_cpp there; the child may still find one
    monkeypatch.setattr(llamacpp, "probe", lambda path, threads, prompt, extra_bufts: f"exit status 1 ({extra_bufts})")
    with pytest.raises(RuntimeError, match=r"cannot run m\.gguf on this machine .*exit status 1 \(True\).*"
                       r"exit status 1 \(False\).*--rows"):  # fmt: skip
        llamacpp.usable_extra_bufts(tmp_path / "m.gguf", 1, [1], lambda line: None)


def test_the_probe_reports_a_child_that_fails(tmp_path, monkeypatch):
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text("raise ImportError('no llama.cpp here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    failed = llamacpp.probe(tmp_path / "m.gguf", 1, [1, 2], extra_bufts=True)
    assert failed.startswith("exit status 1: ImportError") and "pip install 'minillama[llamacpp]'" in failed


def test_extra_buffer_types_changes_the_defaults_only_inside_the_block(crashing_llama_cpp, monkeypatch):
    monkeypatch.syspath_prepend(str(crashing_llama_cpp.parent / "fake"))
    for name in ("llama_cpp", "llama_cpp.llama_cpp"):
        monkeypatch.setitem(sys.modules, name, None)  # what was there comes back after the test
        del sys.modules[name]
    import llama_cpp.llama_cpp as api

    with llamacpp.extra_buffer_types(False):
        assert api.llama_model_default_params().use_extra_bufts is False
    assert api.llama_model_default_params().use_extra_bufts is True
    with llamacpp.extra_buffer_types(True):
        assert api.llama_model_default_params().use_extra_bufts is True


def test_a_compiled_runner_records_its_inductor_settings():
    # ml.compile_decode's defaults change over time (cpp_wrapper joined them): a run says which it used
    class Step:
        options, compile_s = {"freezing": True, "cpp_wrapper": True}, 1.5

    class Runner:
        impl, variant, threads = "minillama", "fp32-compiled", 2

        def weight_bytes(self):
            return 100, 50

    compiled = Runner()
    compiled.step = Step()
    times = [(0.1, 0.5), (0.1, 0.7)]
    entry = llamacpp._entry("32-bit", compiled, times, {"fp32-compiled": [1, 2]}, 3.0, 11)
    assert entry["compile_options"] == Step.options and entry["compile_s"] == 1.5
    assert entry["decode_ms_per_token"] == pytest.approx(60.0)  # median of 50 and 70 ms over 10 steps
    eager = Runner()
    eager.variant = "fp32"
    entry = llamacpp._entry("32-bit", eager, times, {"fp32": [1, 2]}, 3.0, 11)
    assert "compile_options" not in entry and "compile_s" not in entry


def test_the_16_bit_row_runs_minillama_in_bfloat16_and_in_float16():
    # float16 is llama.cpp's own 16-bit format (F16): the row pairs it with both of minillama's 16-bit copies
    assert llamacpp.ROWS["16-bit"] == (("F16",), ("bf16", "fp16"))
    base = random_model(ml.MODELS["tiny"])
    for variant, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16)]:
        copy = llamacpp.minillama_model(base, variant)
        assert copy is not base and {p.dtype for p in copy.parameters()} == {dtype}
        for (name, ours), theirs in zip(copy.state_dict().items(), base.state_dict().values()):
            if ours.is_floating_point() and ".cache." not in name:
                assert torch.equal(ours, theirs.to(dtype)), name  # rounded once, from the float32 weights
    assert {p.dtype for p in base.parameters()} == {torch.float32}  # the source is left as it was
    with pytest.raises(ValueError, match="fp16"):
        llamacpp.minillama_model(base, "fp8")
