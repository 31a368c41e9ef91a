"""llama.cpp as the peer: the same weights in each format, llama.cpp and minillama side by side on a CPU
(chapters 7 and 9; `python -m minillama bench --peer llamacpp`).

The model (default SmolLM2-135M-Instruct, `ml.fetch`; its file is Q4_1, which `ml.load` dequantises to
float32: those float32 weights are the source of every format) is written as GGUF (`ml.save_gguf`) in
each ggml type and run by llama.cpp through llama-cpp-python (an optional dependency:
`pip install 'minillama[llamacpp]'`, which builds llama.cpp from source); minillama runs the same float32
weights in its own formats. Each row of the comparison pairs one width of weights:

  row      llama.cpp                         minillama
  32-bit   F32                               fp32 (the source weights, exactly)
  16-bit   F16                               bf16 (the weights rounded to bfloat16), fp16 (rounded to
                                             float16, the format of llama.cpp's F16)
  8-bit    Q8_0 (int8, f16 scale per 32)     int8 (`ml.quantize`: one scale per output channel)
  4-bit    Q4_0, Q4_1 (per 32)               int4-g32 (`ml.quantize`: scale and zero per 32)

and with `compiled` each minillama variant also runs `ml.compile_decode`'s step (chapter 8: frozen weights,
Inductor's C++ GEMM template or oneDNN per format), named `<variant>-compiled`.

Every runner generates `new_tokens` tokens greedily (argmax, no stop token) from the same prompt ids, with
the same thread count, one prompt at a time: prefill, then one decode step per token. The runs are
interleaved (each repeat runs every runner once, in an order rotated by the repeat), so load on a shared
machine falls on all of them; medians are reported, and the ratios are taken within the run (also repeat
by repeat: `paired`). Beside them the machine's own ceilings (`ceilings.py`): the copy bandwidth and the
bandwidth of the default matrix-vector products on the fp32, bf16 and fp16 weights. The greedy tokens of every
runner are compared with llama.cpp's F32 tokens (positions identical before the first difference).

Not here: the GGUF writer (`minillama/checkpoint/write_gguf.py`), the timing helpers (`timing.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import load
from ..checkpoint.write_gguf import save_gguf
from ..decode import decode_one_token, prefill
from ..quantize import Int4Linear, Int8Linear, quantize
from .ceilings import copy_bandwidth, matvec_seconds
from .machine import cores, machine_info
from .results import fresh_path

INSTALL = (
    "llama-cpp-python is not installed: pip install 'minillama[llamacpp]' (llama-cpp-python==0.3.36, which "
    "builds llama.cpp from source: about ten minutes on 2 cores)"
)
RESULTS = Path("benchmarks") / "llamacpp"  # committed (`--publish`); the default is benchmarks/local/
PROMPT = [{"role": "user", "content": "Explain, step by step, how a language model writes an answer."}]
# row -> (llama.cpp's ggml types, minillama's variants), in the order of the table
ROWS = {
    "32-bit": (("F32",), ("fp32",)),
    "16-bit": (("F16",), ("bf16", "fp16")),
    "8-bit": (("Q8_0",), ("int8",)),
    "4-bit": (("Q4_0", "Q4_1"), ("int4-g32",)),
}
# the targets of issue 24: minillama's best over llama.cpp's best, decode tok/s
TARGETS = {"32-bit": 0.9, "16-bit": 0.9, "8-bit": 0.9, "4-bit": 0.7}


def llama_cpp_module():
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(INSTALL) from None
    return llama_cpp


# ---------------------------------------------------------------------------------------------------------
# the runners: each generates greedily and times prefill and decode apart


def llama_cpp_greedy(llm, prompt: list[int], new_tokens: int) -> tuple[list[int], tuple[float, float]]:
    """`new_tokens` greedy tokens from llama.cpp (`llm` a `llama_cpp.Llama`): the prompt in one batch, then
    one token per `eval`; the argmax is taken of the last position's logits, read in place from llama.cpp.
    Returns the tokens and (prefill, decode) seconds."""
    llama_cpp = llama_cpp_module()
    vocab = llm.n_vocab()

    def argmax() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        return int(logits.argmax())

    llm.reset()  # the cache is rewritten from position 0
    start = time.perf_counter()
    llm.eval(prompt)
    token = argmax()
    prefilled = time.perf_counter()
    out = [token]
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = argmax()
        out.append(token)
    return out, (prefilled - start, time.perf_counter() - prefilled)


@contextlib.contextmanager
def extra_buffer_types(enabled: bool):
    """llama.cpp's "extra" weight buffers (the CPU backend's repacked and AMX layouts: `use_extra_bufts` in
    `llama_model_params`, on by default) while a `llama_cpp.Llama` is made inside this block. llama-cpp-python's
    `Llama` has no argument for it, so with `enabled=False` the defaults it starts from are changed for the
    duration of the block."""
    if enabled:
        yield
        return
    import llama_cpp.llama_cpp as api  # the module whose `llama_model_default_params` `Llama.__init__` calls

    defaults = api.llama_model_default_params

    def without_extra():
        params = defaults()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = without_extra
    try:
        yield
    finally:
        api.llama_model_default_params = defaults


def probe(path: Path, threads: int, prompt: list[int], extra_bufts: bool, timeout: float = 600) -> str | None:
    """Load `path` in llama.cpp and generate 4 greedy tokens from `prompt` in a child process: None if it
    worked, else what went wrong. A crash inside llama.cpp (a segfault ends the whole process) is reported
    here instead of ending the benchmark."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    args = [str(path), str(threads), ",".join(map(str, prompt)), "1" if extra_bufts else "0"]
    code = "import sys; from minillama.bench.llamacpp import _probe_child; _probe_child(*sys.argv[1:])"
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"the process was killed by signal {-done.returncode}"
    return f"exit status {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"


def _probe_child(path: str, threads: str, prompt: str, extra_bufts: str) -> None:
    ids = [int(t) for t in prompt.split(",")]
    runner = LlamaCpp(Path(path), Path(path).stem, int(threads), len(ids) + 4, extra_bufts=extra_bufts == "1")
    runner.run(ids, 4)


def usable_extra_bufts(path: Path, threads: int, prompt: list[int], log) -> tuple[bool, str | None]:
    """Whether llama.cpp runs `path` with its extra weight buffers (its default), and if not, why: some builds
    crash in their AMX matrix product on some CPUs (ggml-org/llama.cpp issue 20824, "segfault in
    ggml_backend_amx_mul_mat"; seen here with llama-cpp-python 0.3.36 on Q8_0 and Q4_0, an Intel Xeon with
    AMX). Then the file runs with them off (plain CPU layouts, no repacking), and the results say so."""
    failed = probe(path, threads, prompt, extra_bufts=True)
    if failed is None:
        return True, None
    log(f"llama.cpp failed on {path.name} with its extra weight buffers (repacked/AMX layouts): {failed}; "
        "trying without them")  # fmt: skip
    again = probe(path, threads, prompt, extra_bufts=False)
    if again is not None:
        raise RuntimeError(
            f"llama.cpp cannot run {path.name} on this machine (with its extra weight buffers: {failed}; "
            f"without: {again}). Leave its row out (--rows) or try another llama-cpp-python build."
        )
    return False, f"with its extra weight buffers (repacked/AMX layouts) llama.cpp failed ({failed}): run without them"


class LlamaCpp:
    """llama.cpp on one GGUF file."""

    impl = "llama.cpp"

    def __init__(self, path: Path, kind: str, threads: int, n_ctx: int, extra_bufts: bool = True):
        llama_cpp = llama_cpp_module()
        self.variant, self.path, self.extra_bufts = kind, path, extra_bufts
        with extra_buffer_types(extra_bufts):
            self.llm = llama_cpp.Llama(
                str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_ctx, verbose=False
            )
        self.threads = threads

    def run(self, prompt: list[int], new_tokens: int):
        return llama_cpp_greedy(self.llm, prompt, new_tokens)

    def weight_bytes(self) -> tuple[int, int]:
        """(bytes, weights) of the matrices a decode step reads: every 2-D tensor but the embedding, which
        a step reads one row of, unless the head is tied to it (then the head reads it whole)."""
        from ..checkpoint import open_gguf

        tensors = open_gguf(self.path).tensors
        names = {t.name for t in tensors}
        read = [t for t in tensors if len(t.shape) == 2 and (t.name != "token_embd.weight" or "output.weight" not in names)]
        return sum(int(t.n_bytes) for t in read), sum(int(t.n_elements) for t in read)


class Minillama:
    """minillama's loop (`prefill`, then `decode_one_token`) on one copy of the model; `step` replaces the
    decode step (a compiled one)."""

    impl = "minillama"

    def __init__(self, model, variant: str, threads: int, step=None):
        self.model, self.variant, self.threads = model, variant, threads
        self.step = step or decode_one_token

    def run(self, prompt: list[int], new_tokens: int):
        tokens = torch.tensor([prompt])
        lengths = torch.tensor([len(prompt)])
        with torch.inference_mode():
            start = time.perf_counter()
            token, _ = prefill(self.model, tokens, lengths)
            prefilled = time.perf_counter()
            out, pos = [token], lengths.clone()
            for _ in range(new_tokens - 1):
                token, _ = self.step(self.model, token, pos)
                out.append(token)
                pos += 1
            done = time.perf_counter()
        return torch.cat(out, dim=1)[0].tolist(), (prefilled - start, done - prefilled)

    def weight_bytes(self) -> tuple[int, int]:
        """(bytes, weights) of the matrices a decode step reads: every linear layer's weights with their
        scales and zeros (the kernels' packed copies instead of the plain codes where they exist)."""
        nbytes = weights = 0
        for m in self.model.modules():
            if isinstance(m, torch.nn.Linear):
                nbytes += m.weight.numel() * m.weight.element_size()
                weights += m.weight.numel()
            elif isinstance(m, (Int8Linear, Int4Linear)):
                codes = m.packed if getattr(m, "packed", None) is not None else m.weight
                extra = [m.scales] + ([m.zeros] if isinstance(m, Int4Linear) else [])
                nbytes += sum(t.numel() * t.element_size() for t in [codes, *extra])
                weights += m.in_features * m.out_features
        return nbytes, weights


def minillama_model(base, variant: str):
    """A copy of `base` (float32) in `variant`'s format: fp32, bf16, fp16, int8 (bf16 activations) or
    int4-gN."""
    if variant == "fp32":
        return base
    if variant == "fp16":
        return copy.deepcopy(base).to(torch.float16)
    model = copy.deepcopy(base).to(torch.bfloat16)
    if variant == "bf16":
        return model
    if variant == "int8":
        return quantize(model, "int8")
    if variant.startswith("int4-g"):
        return quantize(model, "int4", group_size=int(variant.removeprefix("int4-g")))
    raise ValueError(
        f"unknown minillama variant {variant!r}; use fp32, bf16, fp16, int8 or int4-g32/64/128/256"
    )


# ---------------------------------------------------------------------------------------------------------
# the run


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many tokens two greedy runs share before their first difference."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)


def run(
    checkpoint: str = "smollm2-135m",
    rows: tuple[str, ...] = tuple(ROWS),
    new_tokens: int = 128,
    repeats: int = 5,
    threads: int | None = None,
    gguf_dir: str | os.PathLike | None = None,
    compiled: bool = False,
    log=None,
    on_repeat=None,
) -> dict:
    """Measure llama.cpp and minillama on the same weights (see the module docstring); a results dict.
    `on_repeat(results)` is called with the results so far after each repeat (to save them as they come)."""
    llama_cpp = llama_cpp_module()  # before anything is written or loaded
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: at least 1")
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: at least 2 (one from the prefill, one decode step)")
    log = log or (lambda line: None)
    threads = threads or cores()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(llama_cpp, checkpoint, rows, new_tokens, repeats, threads, gguf_dir, compiled, log, on_repeat)
    finally:
        torch.set_num_threads(previous)


def _run(llama_cpp, checkpoint, rows, new_tokens, repeats, threads, gguf_dir, compiled, log, on_repeat) -> dict:
    from ..fetch import fetch
    from ..tokenizer import Tokenizer

    source = fetch(checkpoint) if not Path(checkpoint).exists() else Path(checkpoint)
    if source.suffix != ".gguf":
        raise ValueError(f"{source}: the llama.cpp peer needs a GGUF checkpoint (its tokenizer goes into every file)")
    prompt = Tokenizer.default(source).encode_dialog(PROMPT)
    n_ctx = len(prompt) + new_tokens
    base = load(source, dtype=torch.float32, progress=False)  # the file's own context length goes into the GGUFs
    source_type = sorted({t.tensor_type.name for t in _open(source).tensors if len(t.shape) == 2})
    wall_start = time.perf_counter()
    config = {
        "checkpoint": checkpoint,
        "source": f"{source.name}: {'/'.join(source_type)} blocks, dequantised to float32 by ml.load; every "
        f"format is written from those float32 weights",
        "prompt": PROMPT,
        "prompt_ids": prompt,
        "prompt_len": len(prompt),
        "new_tokens": new_tokens,
        "decode_steps": new_tokens - 1,
        "repeats": repeats,
        "rows": list(rows),
        "threads": {"torch": torch.get_num_threads(), "llama_cpp": threads},
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "interleaved": "each repeat runs every runner once, the order rotated by one per repeat",
    }

    with contextlib.ExitStack() as stack:
        folder = Path(gguf_dir) if gguf_dir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        runners = []
        for row in rows:
            kinds, variants = ROWS[row]
            for kind in kinds:
                path = folder / f"{source.stem.split('.')[0]}-{kind}.gguf"
                if not path.exists():
                    log(f"writing {path.name}")
                    save_gguf(base, path, kind, tokenizer=source)
                extra, why = usable_extra_bufts(path, threads, prompt, log)
                if why:
                    config.setdefault("llama_cpp_without_extra_bufts", {})[kind] = why
                runners.append((row, LlamaCpp(path, kind, threads, n_ctx, extra_bufts=extra)))
            for variant in variants:
                model = minillama_model(base, variant)
                model.setup_cache(batch_size=1, max_seq_len=n_ctx)
                runners.append((row, Minillama(model, variant, threads)))
                if compiled:
                    runners.append((row, _compiled(model, variant, threads, log)))
        log("warm-up: a short generation each (first touch of the weights, llama.cpp's repacking)")
        warm = {}
        for _, r in runners:
            start = time.perf_counter()
            r.run(prompt, min(new_tokens, 8))
            warm[r.variant] = time.perf_counter() - start
        ceilings = _ceilings(runners, log)
        times = {r.variant: [] for _, r in runners}
        tokens, results, load_average = {}, None, []
        for i in range(repeats):
            order = runners[i % len(runners) :] + runners[: i % len(runners)]  # rotated: A B C, B C A, ...
            for _, r in order:
                out, spans = r.run(prompt, new_tokens)
                times[r.variant].append(spans)
                if out != tokens.setdefault(r.variant, out):
                    raise RuntimeError(f"{r.impl} {r.variant}: greedy tokens changed between repeats")
            log(f"repeat {i + 1}/{repeats}: " + ", ".join(
                f"{v} {1e3 * t[-1][1] / (new_tokens - 1):.1f}" for v, t in times.items()) + " ms/token")  # fmt: skip
            runs = [_entry(row, r, times[r.variant], tokens, warm[r.variant], new_tokens) for row, r in runners]
            load_average.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
            results = {
                "machine": machine_info("cpu") | {"threads": threads},
                # runnable processes (1-minute average) after each repeat: above the cores, others competed
                "config": config | {"repeats_done": i + 1, "load_average": load_average},
                "ceilings": dict(ceilings),
                "runs": runs,
                "wall_s": time.perf_counter() - wall_start,
            }
            fastest = max(runs, key=lambda r: r["achieved_GBps"])  # the best weight bandwidth a step reached
            results["ceilings"]["best_step_GBps"] = {k: fastest[k] for k in ("impl", "variant", "achieved_GBps")}
            results["rows"] = compare(results)
            if on_repeat is not None:
                on_repeat(results)
    return results


def _entry(row: str, r, times: list, tokens: dict, warm_s: float, new_tokens: int) -> dict:
    """One runner's figures: medians over the repeats, the per-repeat times, its tokens."""
    nbytes, weights = r.weight_bytes()
    decode = [d / (new_tokens - 1) for _, d in times]
    entry = {
        "impl": r.impl,
        "variant": r.variant,
        "row": row,
        "threads": r.threads,
        "decode_ms_per_token": _median_ms(decode),
        "decode_tok_s": 1 / statistics.median(decode),
        "prefill_ms": _median_ms([p for p, _ in times]),
        "generate_tok_s": new_tokens / statistics.median([p + d for p, d in times]),
        "weight_bytes_per_step": nbytes,
        "bits_per_weight": 8 * nbytes / weights,
        "achieved_GBps": nbytes / statistics.median(decode) / 1e9,
        "times_ms": {
            "prefill": [round(1e3 * p, 3) for p, _ in times],
            "decode_per_token": [round(1e3 * d, 4) for d in decode],
        },
        "warm_up_s": warm_s,  # a compiled step's compilation included
        **({"compile_s": r.step.compile_s} if hasattr(getattr(r, "step", None), "compile_s") else {}),
        # the Inductor settings of a compiled step (ml.compile_decode's defaults change over time)
        **({"compile_options": dict(r.step.options)} if hasattr(getattr(r, "step", None), "options") else {}),
        "tokens": tokens[r.variant],
    }
    if "F32" in tokens:
        entry["agrees_with_llama_cpp_f32"] = leading_agreement(tokens[r.variant], tokens["F32"])
    return entry


def _open(path):
    from ..checkpoint import open_gguf

    return open_gguf(path)


def _compiled(model, variant: str, threads: int, log):
    """The same copy with `ml.compile_decode`'s step (chapter 8; what `ml.generate(..., compile=True)` runs):
    it compiles on its first call, in the warm-up."""
    from ..compiled import compile_decode

    return Minillama(model, f"{variant}-compiled", threads, step=compile_decode(model))


def _ceilings(runners, log) -> dict:
    """Copy bandwidth, and the default (eager) matrix-vector products over the fp32, bf16 and fp16 weights."""
    log("ceilings: copy and matvec")
    out = {"copy_GBps": copy_bandwidth("cpu") / 1e9, "matvec_GBps": {}}
    for _, r in runners:
        if r.impl == "minillama" and r.variant in ("fp32", "bf16", "fp16"):
            nbytes, _ = r.weight_bytes()
            seconds = statistics.median(matvec_seconds(r.model, steps=4) for _ in range(3))
            out["matvec_GBps"][r.variant] = nbytes / seconds / 1e9
    out["best_matvec_GBps"] = max(out["matvec_GBps"].values(), default=None)
    return out


def compare(results: dict) -> list[dict]:
    """Per row: llama.cpp's fastest and minillama's fastest by decode tok/s, their ratio (of medians, and
    the median of the repeat-by-repeat ratios), the target, and whether it is met; the greedy agreement."""
    out = []
    runs = results["runs"]
    for row in results["config"]["rows"]:
        theirs = [r for r in runs if r["row"] == row and r["impl"] == "llama.cpp"]
        ours = [r for r in runs if r["row"] == row and r["impl"] == "minillama"]
        if not theirs or not ours:
            continue
        peer = max(theirs, key=lambda r: r["decode_tok_s"])
        best = max(ours, key=lambda r: r["decode_tok_s"])
        pairs = zip(best["times_ms"]["decode_per_token"], peer["times_ms"]["decode_per_token"])
        ratio = best["decode_tok_s"] / peer["decode_tok_s"]
        out.append({
            "row": row,
            "llama_cpp": peer["variant"],
            "llama_cpp_tok_s": peer["decode_tok_s"],
            "minillama": best["variant"],
            "minillama_tok_s": best["decode_tok_s"],
            "ratio": ratio,
            "ratio_paired": statistics.median(t / o for o, t in pairs),
            "target": TARGETS[row],
            "met": ratio >= TARGETS[row],
            "same_tokens": best["tokens"] == peer["tokens"],
            "agreement": leading_agreement(best["tokens"], peer["tokens"]),
        })  # fmt: skip
    return out


def load_committed(pattern: str = "benchmarks/llamacpp/*.json") -> dict | None:
    """The newest committed run (what chapters 7 and 9 render), or None when there is none. A relative
    pattern is tried from the working directory, then from the repository this package sits in."""
    from .results import load_results

    found = [r for r in load_results(pattern) if "rows" in r and "ceilings" in r]
    return found[-1] if found else None


def run_of(results: dict, variant: str) -> dict | None:
    """The entry of `variant` (e.g. "F32", "int8-compiled") in `results`, or None."""
    return next((r for r in results["runs"] if r["variant"] == variant), None)


# ---------------------------------------------------------------------------------------------------------
# the command line


def _isa(machine: dict) -> str:
    """" (AVX2)": the CPU's vector instructions, where the run recorded them (runs before 2026-12-03 did not)."""
    return f" ({machine['cpu_isa']})" if machine.get("cpu_isa") else ""


def table(results: dict) -> str:
    """The runs, one line each, and the row ratios."""
    c = results["config"]
    lines = [
        f"{results['machine']['name']}{_isa(results['machine'])}: {c['threads']['llama_cpp']} threads, {c['new_tokens']} new tokens, "
        f"prompt {c['prompt_len']}, {c.get('repeats_done', c['repeats'])} interleaved repeats (medians)",
        f"{'row':7} {'impl':10} {'variant':14} {'bits/w':>6} {'ms/tok':>7} {'tok/s':>6} {'GB/s':>5} {'agree':>5}",
    ]
    for r in results["runs"]:
        agree = r.get("agrees_with_llama_cpp_f32", "")
        lines.append(
            f"{r['row']:7} {r['impl']:10} {r['variant']:14} {r['bits_per_weight']:6.2f} "
            f"{r['decode_ms_per_token']:7.2f} {r['decode_tok_s']:6.1f} {r['achieved_GBps']:5.1f} {agree:>5}"
        )
    for kind, why in c.get("llama_cpp_without_extra_bufts", {}).items():
        lines.append(f"{kind}: {why}")
    ceil = results["ceilings"]
    matvec = ", ".join(f"{k} {v:.1f}" for k, v in ceil["matvec_GBps"].items())
    lines.append(f"ceilings: copy {ceil['copy_GBps']:.1f} GB/s; default matvec {matvec} GB/s")
    for row in results["rows"]:
        same = "identical" if row["same_tokens"] else f"identical for the first {row['agreement']}"
        lines.append(
            f"{row['row']}: minillama {row['minillama']} / llama.cpp {row['llama_cpp']} = {row['ratio']:.2f} "
            f"(paired {row['ratio_paired']:.2f}; target {row['target']}: {'met' if row['met'] else 'missed'}); "
            f"greedy tokens {same}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minillama bench --peer llamacpp",
        description="llama.cpp and minillama on the same weights, each format written as GGUF: decode tok/s, "
        "ratios within one interleaved run, greedy agreement, this machine's ceilings. Needs llama-cpp-python "
        "(pip install 'minillama[llamacpp]'). Writes JSON to benchmarks/local/ (git-ignored); --publish to "
        "benchmarks/llamacpp/, which chapters 7 and 9 render.",
    )
    p.add_argument("--peer", choices=("llamacpp",), required=True, help="the engine compared: llama.cpp")
    p.add_argument("--model", default="smollm2-135m", help="a model ml.fetch knows, or a .gguf file")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated from {', '.join(ROWS)}")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per generation (default 128)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians reported (default 5)")
    p.add_argument("--threads", type=int, default=None, help="threads of both engines (default: the cores)")
    p.add_argument("--gguf-dir", default=None, help="keep the written GGUF files here (default: a temporary folder)")
    p.add_argument("--compile", action="store_true", help="also minillama's compiled decode step")
    p.add_argument("--json", default=None, help="where to write the results")
    p.add_argument("--publish", action="store_true", help="write to benchmarks/llamacpp/<machine>.json")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    if ns.publish and ns.json:
        p.error("pass --json PATH or --publish, not both")
    log = None if ns.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        llama_cpp_module()
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if ns.no_save:
        path = None
    elif ns.json:
        path = Path(ns.json)
    elif ns.publish:
        path = fresh_path(RESULTS / f"{machine_info('cpu')['slug']}.json")
    else:
        info = machine_info("cpu")
        path = Path("benchmarks") / "local" / f"llamacpp-{info['slug']}-{info['date']}.json"

    def save(results: dict) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1) + "\n")

    results = run(
        ns.model,
        rows=tuple(r.strip() for r in ns.rows.split(",") if r.strip()),
        new_tokens=ns.new_tokens,
        repeats=ns.repeats,
        threads=ns.threads,
        gguf_dir=ns.gguf_dir,
        compiled=ns.compile,
        log=log,
        on_repeat=save,
    )
    print(table(results))
    if path is not None:
        print(f"results: {path}")
    return 0
