"""The benchmark harness: one short run of the tiny model, its results checked for shape and arithmetic.

No timing is asserted (this is a shared, noisy machine): the tests check that every figure the
chapters print is there, is derived from the measured times the way the docs say, and that bytes per
step match a count made here from the model's own tensors.
"""

import json
import math
from datetime import date

import matplotlib
import matplotlib.figure
import matplotlib.pyplot
import pytest
import torch

import minillama as ml
from minillama import bench

matplotlib.use("Agg")

PROMPT, NEW, REPEATS = 8, 4, 2


@pytest.fixture(scope="module")
def results():
    torch.set_num_threads(2)
    return bench.run(
        "tiny",
        batches=(1, 2),
        prompt_len=PROMPT,
        new_tokens=NEW,
        dtype="float32",
        repeats=REPEATS,
        variants="eager,static,generate,hf",
        device="cpu",
        seed=0,
    )


def test_machine_fields(results):
    m = results["machine"]
    assert m["device"] == "cpu" and m["gpu"] is None
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert isinstance(m["cores"], int) and m["cores"] >= 1
    assert m["torch"] == torch.__version__ and m["minillama"] == ml.__version__
    assert date.fromisoformat(m["date"])
    assert m["slug"] and all(c.isalnum() or c == "-" for c in m["slug"])
    assert set(results["config"]["args"]) >= {"dim", "n_layers", "vocab_size"}


def test_every_run_is_complete(results):
    runs = results["runs"]
    assert {(r["variant"], r["batch"]) for r in runs} == {
        (v, b) for v in ("eager", "static", "generate", "hf") for b in (1, 2)
    }
    for r in runs:
        assert "error" not in r, r.get("error")
        assert all(len(times) == REPEATS for times in r["times_ms"].values())
        assert r["generate_tok_s"] > 0 and math.isfinite(r["generate_tok_s"])
        # generate tok/s is batch × new tokens over the median end-to-end time
        median = sorted(r["times_ms"]["generate"])
        assert r["generate_tok_s"] == pytest.approx(r["batch"] * NEW / (sum(median) / 2 / 1e3), rel=1e-3)
        if r["variant"] == "generate":
            continue  # ml.generate is timed end to end only
        assert r["decode_ms_per_token"] * r["decode_tok_s"] == pytest.approx(1e3 * r["batch"])
        assert r["roofline_fraction"] == pytest.approx(r["decode_tok_s"] / r["roofline_tok_s"])
        assert r["step_over_matvec"] == pytest.approx(r["decode_ms_per_token"] / r["matvec_ms"])
        assert r["achieved_bytes_per_s"] == pytest.approx(
            r["bytes_per_step"] / r["decode_ms_per_token"] * 1e3
        )
        assert r["prefill_tok_s"] == pytest.approx(r["batch"] * PROMPT / r["prefill_ms"] * 1e3)
        assert 0 < r["prefill_mfu"]


def test_bytes_per_step_count_the_models_own_tensors(results):
    # counted here from the tensors a decode step reads: every weight but the embedding table, the
    # embedding rows of the batch, and K and V of every layer for the context, 4 bytes each (float32)
    args = ml.MODELS["tiny"]
    with torch.device("meta"):
        model = ml.Transformer(args)
    weights = sum(p.numel() for n, p in model.named_parameters() if n != "tok_embeddings.weight")
    context = PROMPT + NEW // 2
    for r in results["runs"]:
        b = r["batch"]
        model.setup_cache(b, context)
        kv = sum(c.k.numel() + c.v.numel() for c in (layer.attention.cache for layer in model.layers))
        assert r["context"] == context
        assert r["bytes_per_step"] == 4 * (weights + b * args.dim + kv)
        assert r["bytes_per_step"] == ml.decode_step_bytes(args, context, b, 4)


def test_ratios_are_minillama_over_hf(results):
    runs = {(r["variant"], r["batch"]): r for r in results["runs"]}
    rows = results["ratios"]
    assert {(row["minillama"], row["hf"], row["batch"]) for row in rows} == {
        (v, "hf", b) for v in ("eager", "static", "generate") for b in (1, 2)
    }
    for row in rows:
        ours, theirs = runs[(row["minillama"], row["batch"])], runs[(row["hf"], row["batch"])]
        assert row["generate"] == pytest.approx(ours["generate_tok_s"] / theirs["generate_tok_s"])
        if "decode" in row:
            assert row["decode"] == pytest.approx(ours["decode_tok_s"] / theirs["decode_tok_s"])
    head = results["headline"]
    best = max(
        (r for r in results["runs"] if r["impl"] == "minillama" and r["batch"] == 1),
        key=lambda r: r["generate_tok_s"],
    )
    assert head["minillama"] == best["variant"] and head["hf"] == "hf"
    assert head["ratio"] == pytest.approx(best["generate_tok_s"] / runs[("hf", 1)]["generate_tok_s"])


def test_the_same_greedy_tokens_as_hugging_face(results):
    # HF got the weights through ml.save + from_pretrained: greedy decoding must agree token for token
    for r in results["runs"]:
        assert r["same_tokens"], r["variant"]


def test_prefill_flops_counted_independently():
    args = ml.MODELS["tiny"]
    c = ml.count_parameters(args)
    t = 5
    matmul = args.n_layers * (c.attention + c.feed_forward)
    attention = sum(2 * 2 * args.n_layers * args.n_heads * args.head_dim * (i + 1) for i in range(t))
    assert bench.prefill_flops(args, t, batch=3) == 3 * (2 * t * matmul + attention + 2 * c.output)


def test_json_round_trip_and_plots(results, tmp_path):
    path = bench.save_results(results, tmp_path / "r.json")
    assert bench.load_results(str(tmp_path / "*.json")) == [json.loads(json.dumps(results))]
    for kind in ("variants", "waterfall", "batch"):
        fig = bench.plot_results(results, kind=kind)
        assert isinstance(fig, matplotlib.figure.Figure)
        # every panel labels its quantity; the bottom one (stacked panels share it) the x axis
        assert fig.axes[-1].get_xlabel() and all(ax.get_ylabel() for ax in fig.axes)
        fig.canvas.draw()  # tick labels are formatted at draw time
        ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
        # log axes print plain numbers: mathtext superscripts (10^2) are drawn at 0.7 of the font, too small
        assert ticks and not any("$" in t for t in ticks), ticks
        matplotlib.pyplot.close(fig)
    assert (
        bench.default_path(results).name == f"{results['machine']['slug']}-{results['machine']['date']}.json"
    )
    assert path.exists()


def test_merge_keeps_first_measurement_and_recomputes_ratios(results):
    part = json.loads(json.dumps(results))
    part["runs"] = [r for r in part["runs"] if r["variant"] == "hf"]
    part["config"]["variants"] = ["hf"]
    merged = bench.merge_results([part, results])
    assert len(merged["runs"]) == len(results["runs"])
    assert all(r["part"] == 0 for r in merged["runs"] if r["variant"] == "hf")
    assert merged["ratios"] == bench.ratios(merged)
    bad = json.loads(json.dumps(results))
    bad["config"]["dtype"] = "bfloat16"
    with pytest.raises(ValueError, match="dtype"):
        bench.merge_results([results, bad])


def test_command_line_writes_json(tmp_path, capsys):
    path = tmp_path / "cli.json"
    argv = ["--model", "tiny", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1"]
    assert bench.main([*argv, "--variants", "eager", "--no-ceilings", "--quiet", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert r["config"]["variants"] == ["eager"] and r["machine"]["cpu"]
    # the CPU's vector instructions: "AMD EPYC" names CPUs with AVX-512 and without (their kernels differ)
    assert r["machine"]["cpu_isa"] in {"DEFAULT", "AVX2", "AVX512", "VSX", "ZVECTOR", "SVE256", "NO AVX"}
    assert "tok/s" in capsys.readouterr().out


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_local_run_leaves_the_books_results_alone(tmp_path):
    """`make bench` / `python -m minillama bench` with its default output, in a scratch copy of the
    committed results: they stay byte for byte what chapters 7-8 render; the run lands in benchmarks/local/."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    committed = tmp_path / "benchmarks" / "results"
    before, rendered = _snapshot(committed), bench.load_results(str(committed / "*.json"))
    assert rendered, "the scratch copy holds the committed results"
    argv = ["--model", "tiny", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--variants", "eager",
            "--no-ceilings", "--quiet"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "minillama", "bench", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert _snapshot(committed) == before
    assert bench.load_results(str(committed / "*.json")) == rendered
    local = sorted((tmp_path / "benchmarks" / "local").glob("*.json"))
    assert len(local) == 1 and f"results: {local[0].relative_to(tmp_path)}" in run.stdout
    assert json.loads(local[0].read_text())["config"]["variants"] == ["eager"]


def test_publishing_adds_a_result_and_never_replaces_one(results, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = results["machine"]
    assert bench.default_path(results) == bench.LOCAL / f"{m['slug']}-{m['date']}.json"
    first = bench.save_results(results, publish=True)
    assert first == bench.RESULTS / f"{m['slug']}-{m['date']}.json"
    kept = first.read_bytes()
    second = bench.save_results({**results, "wall_s": -1.0}, publish=True)  # the same machine, the same day
    assert second == bench.RESULTS / f"{m['slug']}-{m['date']}-2.json" and first.read_bytes() == kept
    assert bench.fresh_path(first) == bench.RESULTS / f"{m['slug']}-{m['date']}-3.json"
    assert len(bench.load_results(str(tmp_path / bench.RESULTS / "*.json"))) == 2
    with pytest.raises(SystemExit):
        bench.main(["--publish", "--json", "x.json"])


def test_hf_variants_without_transformers_suggest_the_variants_without_them(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ValueError, match=r"\(hf, hf-static\) need transformers.*--variants eager,static$"):
        bench.run("tiny", variants="eager,static,hf,hf-static", new_tokens=2, prompt_len=4, repeats=1)
    with pytest.raises(ValueError, match=r"--variants eager,static,compile,generate$"):
        bench.run("tiny", variants="hf", new_tokens=2, prompt_len=4, repeats=1)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="valid variants: eager"):
        bench.run("tiny", variants="eager,turbo")
    with pytest.raises(ValueError, match="neither a catalogue name"):
        bench.run("no-such-model", variants="eager")
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        bench.run("tiny", new_tokens=1, variants="eager")
    with pytest.raises(ValueError, match="max_seq_len=2048"):
        bench.run("tiny", prompt_len=2000, new_tokens=100, variants="eager")


@pytest.mark.parametrize("via", ["disk", "memory"])
def test_hf_peer_holds_the_same_weights(monkeypatch, via):
    # both routes of the copy (ml.save + from_pretrained for small models, in memory for large ones)
    # give HF's LlamaForCausalLM our logits
    args = ml.ModelArgs(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=300, multiple_of=32, max_seq_len=64
    )
    model = bench.build_model(args, torch.device("cpu"), torch.float32, seed=1)
    monkeypatch.setattr(bench.models, "HF_VIA_DISK_BYTES", 2**40 if via == "disk" else 0)
    hf = bench.hf_peer(model)
    tokens = torch.randint(0, args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    assert ours.abs().max() > 1e-2  # not trivially small logits


@pytest.mark.parametrize("script", ["cpu.sh", "gpu_h200.sh"])
def test_benchmark_scripts_parse_and_name_real_variants(script):
    import re
    import subprocess
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / script
    subprocess.run(["bash", "-n", str(path)], check=True)  # a syntax error fails here, not on the GPU
    text = path.read_text()
    named = re.findall(r"--variants[ =]\"?([\w,-]+)", text) + re.findall(r"^VARIANTS=([\w,-]+)", text, re.M)
    names = {v for group in named for v in group.split(",") if v}
    assert names, f"no variants found in {script}"
    assert bench.variants.variant_list(sorted(names))  # raises on an unknown variant name


def test_tp_variant_outside_torchrun_says_how_to_launch():
    from minillama.bench.variants import tensor_parallel

    model = ml.Transformer(
        ml.ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)
    )
    with pytest.raises(
        ValueError, match="torchrun --nproc-per-node N -m minillama bench --variants static,tp"
    ):
        tensor_parallel(model, torch.device("cpu"))


def test_speculative_variants_give_the_plain_tokens(monkeypatch):
    """The spec-* rows run ml.generate with a draft; compilation is replaced by the eager functions here
    (the compiled path is what `python -m minillama bench` measures), so this stays fast."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    args = ml.ModelArgs(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=64
    )
    names = ["static", "spec-int8-k2", "spec-bf16-k4", "spec-small-k4"]
    results = bench.run(args, prompt_len=6, new_tokens=9, repeats=1, variants=",".join(names), ceilings=False)
    runs = {r["variant"]: r for r in results["runs"]}
    assert set(runs) == set(names)
    for name in names[1:]:
        assert "error" not in runs[name], runs[name].get("error")
        assert runs[name]["same_tokens"], name
        assert runs[name]["generate_tok_s"] > 0
        spec = runs[name]["speculative"]
        assert spec["k"] == int(name[-1]) and 1 <= spec["tokens_per_forward"] <= spec["k"] + 1
    assert bench.variants.TABLE["spec-int8-k8"].extra_positions == 8


def test_quantize_cpu_says_what_to_install_before_building_anything(tmp_path):
    """benchmarks/quantize_cpu.py without torchao: its torchao variants are named with the install line and
    the --variants that run without it, before the minute of building (nothing is written)."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed here: the script runs its variants")
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "quantize_cpu.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "need torchao" in run.stderr and "pip install torchao==0.18.0" in run.stderr
    assert "--variants bf16,int8," in run.stderr and "torchao-int8" not in run.stderr.split("--variants")[-1]
    assert not list(tmp_path.rglob("*.json"))


def test_phone_table_calls_a_cpu_bound_a_kernel_bound():
    # chapter 7: on a CPU the bound is the step's own matrix-vector time, not a roofline of the bus
    from minillama.bench.report import bound_name, phone_table

    assert bound_name("matvec") == "kernel bound" and bound_name("copy") == "roofline"
    cpu = next(r for r in bench.load_results() if r["machine"]["device"] == "cpu")
    t = phone_table(cpu)
    assert t.header[3] == "of kernel bound" and len(t.header) == 6
    assert len(t.rows) == sum("generate_tok_s" in r and "error" not in r for r in cpu["runs"])
    assert "% of kernel bound" in bench.table(cpu) and "% of roofline" not in bench.table(cpu)
