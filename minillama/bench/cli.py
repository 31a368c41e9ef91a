"""The command line of the benchmark: `python -m minillama bench` (or `python -m minillama.bench`)
measures, prints the table and writes the JSON (chapters 7-8).

Not here: anything it calls (`runner.py`, `report.py`, `results.py`).
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..config import MODELS
from .machine import cores
from .report import table
from .results import save_results
from .runner import DTYPES, run
from .variants import VARIANTS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minillama bench",
        description="Prefill and decode throughput of minillama's variants and of Hugging Face generate on the "
        "same weights, against this machine's measured roofline. Writes a JSON of the results.",
    )
    p.add_argument(
        "--model", default="tiny", help=f"{', '.join(MODELS)} (random weights) or a checkpoint folder"
    )
    p.add_argument("--batch", default="1", help="batch sizes, comma-separated (default 1), e.g. 1,2,4,8")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per sequence (32)")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens per sequence (64)")
    p.add_argument(
        "--dtype", default=None, choices=tuple(DTYPES), help="default: float32 on a CPU, else bfloat16"
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed repeats of each variant; medians are reported (5)"
    )
    p.add_argument("--variants", default=None, help=f"comma-separated from: {', '.join(VARIANTS)}")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: the cores this process may use)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts (0)")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds allowed for each variant's warm-up/compile"
    )
    p.add_argument("--no-ceilings", action="store_true", help="skip the copy bandwidth and matmul rate")
    p.add_argument(
        "--json",
        default=None,
        help="where to write the results (default benchmarks/results/<machine>-<date>.json)",
    )
    p.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    device = torch.device(ns.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {ns.device} requested but CUDA is not available (torch {torch.__version__})"
        )
    threads = ns.threads or cores()
    torch.set_num_threads(threads)
    log = None if ns.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    results = run(
        ns.model,
        batches=ns.batch,
        prompt_len=ns.prompt_len,
        new_tokens=ns.new_tokens,
        dtype=ns.dtype or ("float32" if device.type == "cpu" else "bfloat16"),
        repeats=ns.repeats,
        variants=ns.variants,
        device=device,
        seed=ns.seed,
        timeout=ns.timeout,
        ceilings=not ns.no_ceilings,
        log=log,
        on_batch=None if ns.no_save else (lambda partial: save_results(partial, ns.json)),
    )
    print(table(results))
    if not ns.no_save:
        print(f"results: {save_results(results, ns.json)}")
    return 0
