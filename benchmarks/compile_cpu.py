"""SmolLM2-135M's decode step on this CPU, eager against compiled, per weight format (chapter 8, issue 24).

The trained model (`ml.fetch("smollm2-135m")`, dequantised by `ml.load`) in five formats: fp32, bf16,
fp16 (`ml.compile_decode`'s default for it: `CPU_OPTIONS`), and `ml.quantize`'s int8 (per channel) and
int4 (groups of 32; 576 inputs rule out 128) on the bf16 model. Batch 1, greedy. For each format these
decode steps, all in one process:

  eager        `decode_one_token` (the layers call MKL's GEMV / the int8 and int4 ATen kernels)
  compile      `torch.compile(fullgraph=True)` with Inductor's defaults (options {})
  cpp          `minillama.compiled.CPU_OPTIONS`: max_autotune with the C++ GEMM template and ATen as
               candidates, frozen weights (`ml.compile_decode`'s default for int8 and int4)
  cpp-only     the template alone (`max_autotune_gemm_backends="CPP"`, `CPU_FLOAT32_OPTIONS`:
               `ml.compile_decode`'s default for fp32)
  frozen       frozen weights without autotuning (fp32 linears go to MKL's packed GEMM, bf16 to oneDNN):
               `CPU_BF16_OPTIONS`, `ml.compile_decode`'s default for bf16
  *-python     each of the three with `cpp_wrapper=False`: the step's wrapper (the code calling its
               kernels) in Python, as Inductor generates it by default; the three above generate it as
               C++ (`cpp_wrapper=True`, in `ml.compile_decode`'s settings since benchmarks/results/
               intel-xeon-avx512/compile-cpu.json measured it; the runs committed before it have
               no `cpp_wrapper` in their recorded options)

Each variant is compiled once (its compile time recorded), then timed in interleaved rounds (a shared
CPU is noisy: every round runs each variant in turn; the medians over rounds, and the ratios within
the run, are what it measures). Every round prefills the same prompt and decodes `--tokens` tokens;
the greedy tokens of each variant are compared with eager's of the same format. Beside them: the copy
bandwidth of this machine and the matrix-vector bandwidth of the 49,152 x 576 head alone, eager and
compiled, in fp32 and bf16 (the largest matrix, as the default kernel and the template read it).

    .venv/bin/python benchmarks/compile_cpu.py            # -> benchmarks/local/compile-cpu.json (git-ignored)
    .venv/bin/python benchmarks/compile_cpu.py --publish  # -> benchmarks/results/compile-cpu.json (chapter 8's)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import minillama as ml
from minillama.bench import copy_bandwidth, machine_info
from minillama.compiled import (
    CPU_BF16_OPTIONS,
    CPU_FLOAT32_OPTIONS,
    CPU_OPTIONS,
    compile_decode,
    options_for,
)
from minillama.decode import decode_one_token, prefill
from minillama.quantize import Int4Linear, Int8Linear

FORMATS = ("fp32", "bf16", "fp16", "int8", "int4")
VARIANTS = {
    "eager": None,
    "compile": {},
    "cpp": dict(CPU_OPTIONS),
    "cpp-only": dict(CPU_FLOAT32_OPTIONS),
    "frozen": dict(CPU_BF16_OPTIONS),
    # the same with the step's wrapper in Python (what runs committed before cpp_wrapper=True measured)
    "cpp-python": {**CPU_OPTIONS, "cpp_wrapper": False},
    "cpp-only-python": {**CPU_FLOAT32_OPTIONS, "cpp_wrapper": False},
    "frozen-python": {**CPU_BF16_OPTIONS, "cpp_wrapper": False},
}
# what runs by default: in fp32 the defaults, both candidate sets and the template alone; in bf16 both
# candidate sets and ATen's kernels alone (frozen); in int8 and int4 ml.compile_decode's settings (cpp)
# and the template alone; in fp16 its setting (cpp)
PLAN = {
    "fp32": ("eager", "compile", "cpp", "cpp-only"),
    "bf16": ("eager", "cpp", "frozen"),
    "fp16": ("eager", "cpp"),
    "int8": ("eager", "cpp", "cpp-only"),
    "int4": ("eager", "cpp", "cpp-only"),
}
PROMPT = "The three primary colours are"


def build(fmt: str, path) -> nn.Module:
    dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(fmt, torch.bfloat16)
    model = ml.load(path, dtype=dtype, progress=False)
    if fmt == "int8":
        ml.quantize(model, "int8")
    elif fmt == "int4":
        ml.quantize(model, "int4", group_size=32)
    return model.eval().requires_grad_(False)


def weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads from the weights: every matrix as its kernel reads it (int8: codes and
    scales; int4: the packed codes and the scales and zeros), the norms, and one row of the embedding."""
    nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    total = 0
    for m in model.modules():
        if isinstance(m, Int4Linear):
            total += nbytes(m.packed, m.scales_and_zeros)
        elif isinstance(m, Int8Linear):
            total += nbytes(m.weight, m.scales)
        elif isinstance(m, (nn.Linear, ml.RMSNorm)):
            total += nbytes(m.weight)
    emb = model.tok_embeddings.weight
    return total + emb.shape[1] * emb.element_size()


def steps_for(model, variant):
    if VARIANTS[variant] is None:
        return decode_one_token
    return compile_decode(model, VARIANTS[variant])


@torch.inference_mode()
def decode(model, step, ids, tokens):
    """Prefill `ids`, then `tokens - 1` decode steps; (tokens, the time of each step in seconds)."""
    x = torch.tensor([ids])
    token, _ = prefill(model, x, torch.tensor([len(ids)]))
    pos = torch.tensor([len(ids)])
    out, times = [int(token)], []
    for _ in range(tokens - 1):
        start = time.perf_counter()
        token, _ = step(model, token, pos)
        times.append(time.perf_counter() - start)
        pos += 1
        out.append(int(token))
    return out, times


def head_bandwidth(dtype, compiled: bool, steps: int = 20) -> float:
    """Bytes per second of x @ W.T for a 49,152 x 576 matrix (SmolLM2's head shape), random weights,
    eager or compiled with `ml.compile_decode`'s default settings for `dtype`."""
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(576, 49152, bias=False).to(dtype).requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(49152, 576, generator=g).to(dtype))
    x = torch.randn(1, 576, generator=g).to(dtype)
    fn = torch.compile(head, fullgraph=True, dynamic=False) if compiled else head
    times = []
    # torch.compile(options=...) would leave freezing off (see minillama.compiled): patch the config
    with torch._inductor.config.patch(options_for("cpu", dtype) if compiled else {}), torch.inference_mode():
        for _ in range(3):
            fn(x)
        for _ in range(steps):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return head.weight.numel() * head.weight.element_size() / statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {FORMATS}")
    parser.add_argument(
        "--variants", default=None, help=f"of {tuple(VARIANTS)}, for every format (default: {PLAN})"
    )
    parser.add_argument("--tokens", type=int, default=32, help="tokens per round (1 from the prefill)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", default=None, help="default: benchmarks/local/compile-cpu.json")
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/compile-cpu.json")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add these formats to the output file's (a run per format group)",
    )
    opts = parser.parse_args(argv)
    formats = opts.formats.split(",")
    for f in formats:
        if f not in FORMATS:
            parser.error(f"unknown format {f!r}; use some of {FORMATS}")
    plan = {f: opts.variants.split(",") if opts.variants else list(PLAN[f]) for f in formats}
    for v in {v for vs in plan.values() for v in vs}:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; use some of {tuple(VARIANTS)}")
    if any("eager" not in vs for vs in plan.values()):
        parser.error("the variants must include eager (the tokens and times are compared with it)")
    if opts.publish and opts.out:
        parser.error("pass --out PATH or --publish, not both")
    out = Path(opts.out or f"benchmarks/{'results' if opts.publish else 'local'}/compile-cpu.json")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    path = ml.fetch("smollm2-135m")
    tok = ml.Tokenizer.default(path)
    ids = tok.encode(PROMPT, bos=True)
    results = {
        "machine": machine_info("cpu"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "inductor_vec_isa": str(pick_vec_isa()),
        "model": "smollm2-135m",
        "prompt_tokens": len(ids),
        "tokens": opts.tokens,
        "rounds": opts.rounds,
        "plan": plan,
        "options": {v: VARIANTS[v] for v in VARIANTS},
        "ceilings": {},
        "formats": {},
    }
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    results["ceilings"]["copy_gb_s"] = copy_bandwidth("cpu") / 1e9
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        for compiled in (False, True):
            key = f"head_{name}_{'cpp' if compiled else 'eager'}_gb_s"
            results["ceilings"][key] = head_bandwidth(dtype, compiled) / 1e9
            log(key, round(results["ceilings"][key], 1))
    models = {f: build(f, path) for f in formats}
    for f, model in models.items():
        model.setup_cache(1, len(ids) + opts.tokens)
        entry = results["formats"][f] = {"weight_bytes": weight_bytes(model), "variants": {}}
        for v in plan[f]:
            step = steps_for(model, v)
            start = time.perf_counter()
            tokens, _ = decode(model, step, ids, 3)  # compiles (prefill stays eager)
            first = time.perf_counter() - start
            entry["variants"][v] = {
                "compile_s": getattr(step, "compile_s", None),
                "first_call_s": first,
                "times": [],
                "tokens": None,
            }
            log(f, v, "ready", round(first, 1), "s")
    for r in range(opts.rounds):
        for f, model in models.items():
            for v in plan[f]:
                tokens, times = decode(model, steps_for(model, v), ids, opts.tokens)
                rec = results["formats"][f]["variants"][v]
                rec["times"].append(statistics.median(times))
                rec["tokens"] = rec["tokens"] or tokens
                rec.setdefault("same_tokens_every_round", True)
                rec["same_tokens_every_round"] &= tokens == rec["tokens"]
        log("round", r + 1, "of", opts.rounds)
    for f, entry in results["formats"].items():
        eager = entry["variants"]["eager"]
        for v, rec in entry["variants"].items():
            rec["ms_per_token"] = 1e3 * statistics.median(rec["times"])
            rec["tok_s"] = 1e3 / rec["ms_per_token"]
            rec["gb_s"] = entry["weight_bytes"] / rec["ms_per_token"] / 1e6
            rec["speedup_vs_eager"] = statistics.median(
                e / t for e, t in zip(eager["times"], rec["times"])
            )  # within each round, then the median
            rec["same_tokens_as_eager"] = rec["tokens"] == eager["tokens"]
            agree = next((i for i, (a, b) in enumerate(zip(rec["tokens"], eager["tokens"])) if a != b), None)
            rec["tokens_agreeing_with_eager"] = len(rec["tokens"]) if agree is None else agree
            log(f"{f:5} {v:12} {rec['ms_per_token']:7.1f} ms/token {rec['gb_s']:5.1f} GB/s "
                f"x{rec['speedup_vs_eager']:.2f} compile {rec['compile_s'] or 0:.0f} s "
                f"same tokens {rec['same_tokens_as_eager']}")  # fmt: skip
    if opts.append and out.exists():
        earlier = json.loads(out.read_text())
        earlier["formats"].update(results["formats"])
        earlier.setdefault("run_times", [earlier["machine"]["time"]]).append(results["machine"]["time"])
        earlier["plan"].update(results["plan"])
        results = earlier
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    log("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
