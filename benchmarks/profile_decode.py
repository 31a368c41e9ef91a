"""Where a decode step's time goes, line by line: the tiny model at batch 1 on a CPU.

Two halves. Run the decode loop under a sampling profiler (py-spy, not a dependency of the project;
`pip install py-spy` anywhere), then attribute its samples to minillama's source lines, with the share
spent inside matrix products (MKL/oneDNN gemv/gemm) split out:

    py-spy record --native -r 500 -f raw -o decode.txt -- python benchmarks/profile_decode.py --seconds 20
    python benchmarks/profile_decode.py --report decode.txt

`--compile` profiles the torch.compile'd step instead. Without py-spy, `--ops` prints torch.profiler's
table of aten operations for the same loop.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import torch

import minillama as ml
from minillama import bench


def loop(seconds: float, compiled: bool, threads: int, ops: bool) -> None:
    torch.set_num_threads(threads)
    model = bench.build_model("tiny", torch.device("cpu"), torch.float32)
    model.setup_cache(1, 96)
    tokens = torch.randint(0, model.args.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    step = torch.compile(ml.decode_one_token, fullgraph=True) if compiled else ml.decode_one_token
    with torch.no_grad():
        token, _ = ml.prefill(model, tokens, torch.tensor([32]))
        pos = torch.tensor([32])
        for _ in range(3):
            step(model, token, pos)
        if ops:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(50):
                    step(model, token, pos)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            return
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            step(model, token, pos)


def report(path: str, rows: int = 30) -> None:
    """Samples inside decode_one_token, by the innermost minillama line on the stack; and how many of
    them were inside a BLAS matrix product."""
    total, by_line, in_blas = 0, collections.Counter(), collections.Counter()
    for raw in open(path):
        stack, _, n = raw.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if not any("decode_one_token" in f for f in frames):
            continue
        n = int(n)
        total += n
        ours = [f for f in frames if "(minillama/" in f] or ["(outside minillama)"]
        line = re.sub(r"^(\S+) \((minillama/[^)]+)\)$", r"\2 \1", ours[-1])
        by_line[line] += n
        if any(re.search(r"gemv|gemm|sgemm", f) for f in frames):
            in_blas[line] += n
    if not total:
        raise SystemExit(f"no samples inside decode_one_token in {path}")
    blas = sum(in_blas.values())
    print(f"{total} samples in the decode step; {100 * blas / total:.1f}% inside matrix products")
    print(f"{'share':>6} {'in BLAS':>8}  line")
    for line, n in by_line.most_common(rows):
        print(f"{100 * n / total:5.1f}% {100 * in_blas[line] / total:7.1f}%  {line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--compile", action="store_true", help="profile torch.compile(decode_one_token)")
    # one thread: with more, py-spy loses most samples inside threaded BLAS (its native unwinding fails there)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ops", action="store_true", help="torch.profiler's op table instead of a loop")
    p.add_argument("--report", metavar="RAW", help="summarise a py-spy raw file by minillama line")
    ns = p.parse_args()
    if ns.report:
        report(ns.report)
    else:
        loop(ns.seconds, ns.compile, ns.threads, ns.ops)


if __name__ == "__main__":
    main()
