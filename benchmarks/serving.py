"""Chapter 12's serving run: static batching, the engine, prefix sharing and transformers' continuous
batching on one seeded Poisson workload, for the tiny model (random weights) and SmolLM2-135M
(real weights, `ml.fetch`), on this CPU, written to one JSON (ratios within the run are the claims).

    .venv/bin/python benchmarks/serving.py                      # -> benchmarks/serving/cpu.json
    .venv/bin/python benchmarks/serving.py --models tiny --out /tmp/x.json --threads 2
    .venv/bin/python benchmarks/serving.py --budget-sweep 32,64,256   # adds the engine at three budgets
    DEVICE=cuda python benchmarks/serving.py --models llama-3.1-8b-shaped ...   # see gpu_h200.sh

One thread and the process's CPU time by default: on a machine shared with other work, wall time
measures the neighbours (see `minillama.bench.serving.Clock`); `--wall` on an idle machine or a GPU.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import minillama as ml
from minillama.bench import machine_info
from minillama.bench import serving as sb
from minillama.bench.models import hf_peer
from minillama.model import random_model

SIZES = {  # per model: the workload; the rate (per CPU second) keeps a queue, so throughput is the server's
    "tiny": {"n": 24, "rate": 16.0},
    "smollm2-135m": {"n": 16, "rate": 4.0},
}


def build(name: str, device: str, dtype: torch.dtype):
    if name == "smollm2-135m":
        return ml.load(ml.fetch(name), device=device, dtype=dtype, progress=False)
    if name.endswith("-shaped"):  # the shape of a catalogue model, random weights (GPUs without a checkpoint)
        return random_model(ml.MODELS[name.removesuffix("-shaped")], device=device, dtype=dtype)
    return random_model(ml.MODELS[name], device=device, dtype=dtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2-135m")
    p.add_argument("--out", default="benchmarks/serving/cpu.json")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--wall", action="store_true", help="wall time instead of this process's CPU time")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' continuous batching")
    p.add_argument("--n", type=int, help="requests (default per model)")
    p.add_argument("--rate", type=float, help="requests per second (default per model)")
    p.add_argument("--budget-sweep", metavar="B,B,...",
                   help="instead of the comparison: the engine alone at these tokens-per-step budgets, written "
                   "into --out's existing JSON as models[name]['budget_sweep'] (one run of its own)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.budget_sweep:
        return sweep(args, [int(b) for b in args.budget_sweep.split(",")])
    results = {
        "machine": machine_info(args.device),
        "threads": args.threads,
        "dtype": args.dtype,
        "models": {},
    }
    for name in args.models.split(","):
        begin = time.perf_counter()
        model = build(name, args.device, dtype)
        hf = None if args.no_hf else hf_peer(model)
        size = {**SIZES.get(name, {"n": 32, "rate": 8.0})}
        size.update({k: v for k, v in (("n", args.n), ("rate", args.rate)) if v is not None})
        print(f"== {name} ({size})", flush=True)
        results["models"][name] = sb.compare(model, hf, **size, wall=args.wall, log=lambda s: print(s, flush=True))
        results["models"][name]["wall_s"] = time.perf_counter() - begin
        print(
            json.dumps(results["models"][name]["ratios"], indent=1),
            results["models"][name]["identical"],
            flush=True,
        )
        del model, hf
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def sweep(args, budgets: list[int]) -> int:
    """The budget sweep of every model, merged into the committed comparison's JSON."""
    out = Path(args.out)
    results = json.loads(out.read_text())
    for name in args.models.split(","):
        model = build(name, args.device, getattr(torch, args.dtype))
        size = {**SIZES.get(name, {"n": 32, "rate": 8.0})}
        print(f"== {name} budgets {budgets} ({size})", flush=True)
        run = sb.budget_sweep(model, budgets, **size, wall=args.wall, log=lambda s: print(s, flush=True))
        run["machine"] = machine_info(args.device)
        results["models"][name]["budget_sweep"] = run
        del model
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
