"""The decode step of one Llama 3.1 8B block per weight format, on this CPU (chapter 9).

One 8B block (218M weights: dim 4,096, 32 heads over 8 KV heads, SwiGLU width 14,336) with a 16,384-word
head, so that the block's matrices, not the head, dominate the bytes as they do in the whole 8B; random
weights (seeded), bfloat16 activations, batch 1, 64 positions cached. Every variant is built from the same
bf16 model and measured in the same process, in interleaved rounds (a shared CPU is noisy: the ratios
within one round are what this measures, the absolute times move from run to run):

  bf16                  the 16-bit model, eager
  int8, int4-gN         ml.quantize (weights int8 per channel / int4 per group of N), eager: the layers call
                        aten._weight_int8pack_mm / aten._weight_int4pack_mm_for_cpu directly
  int8-formula          gpt-fast's formulation, F.linear(x, W.to(x.dtype)) * s, eager (a 16-bit copy of W per call)
  int8-formula-compiled the same, under torch.compile: Inductor rewrites it into _weight_int8pack_mm
  torchao-int8          torchao Int8WeightOnlyConfig, eager and compiled
  torchao-int4-g128     torchao's CPU int4 (prototype Int4OpaqueTensor), eager

    .venv/bin/python benchmarks/quantize_cpu.py            # -> benchmarks/local/quantize-cpu.json (git-ignored)
    .venv/bin/python benchmarks/quantize_cpu.py --publish  # -> benchmarks/results/quantize-cpu.json (chapter 9's)

The torchao-* variants need torchao, which the book's environment (requirements.txt) leaves out: on torch
2.13.0's CPU build its import, which transformers performs whenever torchao is installed, prints warnings
naming library paths into every notebook that imports transformers. Install it for this script only
(`.venv/bin/pip install torchao==0.18.0`) or leave those variants out; the script says so before it builds
anything.
"""

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import minillama as ml
from minillama.bench import copy_bandwidth, machine_info
from minillama.generate import decode_one_token
from minillama.model import random_model
from minillama.quantize import use_kernels

ARGS = ml.MODELS["llama-3.1-8b"].replace(n_layers=1, vocab_size=16_384, max_seq_len=256)
CONTEXT = 64
# name -> (format, group_size, backend, pure-PyTorch formula, compiled)
VARIANTS = {
    "bf16": (None, None, None, False, False),
    "int8": ("int8", None, "minillama", False, False),
    "int8-formula": ("int8", None, "minillama", True, False),
    "int8-formula-compiled": ("int8", None, "minillama", True, True),
    "int4-g32": ("int4", 32, "minillama", False, False),
    "int4-g64": ("int4", 64, "minillama", False, False),
    "int4-g128": ("int4", 128, "minillama", False, False),
    "int4-g256": ("int4", 256, "minillama", False, False),
    "torchao-int8": ("int8", None, "torchao", False, False),
    "torchao-int8-compiled": ("int8", None, "torchao", False, True),
    "torchao-int4-g128": ("int4", 128, "torchao", False, False),
}
SLOW = {"int8-formula", "torchao-int8"}  # seconds per step: fewer steps per round


def build(base, fmt, group_size, backend, formula):
    if fmt is None:
        return base
    model = ml.quantize(copy.deepcopy(base), fmt, group_size=group_size, backend=backend)
    return use_kernels(model, False) if formula else model


def timed_steps(step, model, steps):
    with torch.inference_mode():
        token, pos = torch.tensor([[1]]), torch.tensor([CONTEXT])
        start = time.perf_counter()
        for _ in range(steps):
            step(model, token, pos)
        return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=None, help="default: benchmarks/local/quantize-cpu.json")
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/quantize-cpu.json")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    opts = parser.parse_args()
    names = opts.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"unknown variants {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    if opts.publish and opts.out:
        parser.error("pass --out PATH or --publish, not both")
    out = opts.out or f"benchmarks/{'results' if opts.publish else 'local'}/quantize-cpu.json"
    needs_ao = [n for n in names if VARIANTS[n][2] == "torchao"]
    if needs_ao and importlib.util.find_spec("torchao") is None:  # before a minute of building
        plain = ",".join(n for n in names if n not in needs_ao)
        sys.exit(
            f"quantize_cpu.py: the variants {', '.join(needs_ao)} need torchao, which is not installed here "
            f"(requirements.txt leaves it out). Install it: {sys.executable} -m pip install torchao==0.18.0; "
            f"or run without them: --variants {plain}"
        )
    torch.manual_seed(0)
    base = random_model(ARGS, dtype=torch.bfloat16)
    models, steps, build_s = {}, {}, {}
    for name in names:
        fmt, g, backend, formula, compiled = VARIANTS[name]
        start = time.perf_counter()
        models[name] = build(base, fmt, g, backend, formula)
        models[name].setup_cache(1, CONTEXT + 8)
        steps[name] = torch.compile(decode_one_token, fullgraph=True) if compiled else decode_one_token
        timed_steps(steps[name], models[name], 2)  # warm (and compile)
        build_s[name] = time.perf_counter() - start
        print(f"{name:<24} ready in {build_s[name]:.1f} s", flush=True)
    times = {name: [] for name in names}
    for r in range(opts.rounds):
        for name in names:
            n = max(1, opts.steps // 3) if name in SLOW else opts.steps
            times[name].append(timed_steps(steps[name], models[name], n))
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1] * 1e3:.0f}" for n, t in times.items()), flush=True)
    results = {
        "what": "decode step of one Llama 3.1 8B block (16,384-word head), batch 1, bf16 activations, per weight format",
        "machine": machine_info("cpu"),
        "torch": torch.__version__,
        "torchao": __import__("torchao").__version__ if needs_ao else None,
        "threads": torch.get_num_threads(),
        "args": {"dim": ARGS.dim, "ffn": ARGS.ffn_hidden_dim, "vocab_size": ARGS.vocab_size, "context": CONTEXT},
        "rounds": opts.rounds,
        "copy_bandwidth": copy_bandwidth("cpu"),
        "variants": {},
    }
    for name in names:
        fmt, g, backend, formula, compiled = VARIANTS[name]
        results["variants"][name] = {
            "format": fmt or "bf16",
            "group_size": g,
            "backend": backend,
            "formula": formula,
            "compiled": compiled,
            "bytes": ml.decode_step_bytes(ARGS, CONTEXT, format=fmt, group_size=g or 128),
            "step_s": statistics.median(times[name]),
            "rounds_s": times[name],
            "ratio_to_bf16": [t / b for t, b in zip(times[name], times["bf16"])] if "bf16" in times else None,
        }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=1) + "\n")
    for name, v in results["variants"].items():
        ratio = statistics.median(v["ratio_to_bf16"]) if v["ratio_to_bf16"] else float("nan")
        print(f"{name:<24} {v['step_s'] * 1e3:8.1f} ms  {v['bytes'] / 1e6:6.0f} MB  x{ratio:.2f} of bf16")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
