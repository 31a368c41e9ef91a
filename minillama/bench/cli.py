"""The command line of the benchmark: `python -m minillama bench` (or `python -m minillama.bench`)
measures, prints the table and writes the JSON (chapters 7-8).

`--peer llamacpp` hands the command line to `llamacpp.py` (llama.cpp side by side, its own options).
Not here: anything it calls (`runner.py`, `report.py`, `results.py`, `llamacpp.py`).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from ..config import MODELS
from .machine import cores
from .report import table
from .results import default_path, save_results
from .runner import DTYPES, run
from .variants import VARIANTS


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every default in --help; an option whose default is None or a flag says in its own words."""

    def _get_help_string(self, action):
        quiet = action.default is None or action.default is False
        return action.help if quiet else super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minillama bench",
        description="Prefill and decode throughput of minillama's variants and of Hugging Face generate on the "
        "same weights, against this machine's measured roofline. Writes a JSON of the results to "
        "benchmarks/local/ (git-ignored); --publish adds it to benchmarks/results/, which the book renders.",
        formatter_class=_Help,
    )
    p.add_argument(
        "--model", default="tiny", help=f"{', '.join(MODELS)} (random weights) or a checkpoint folder"
    )
    p.add_argument("--batch", default="1", help="batch sizes, comma-separated, e.g. 1,2,4,8")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens per sequence")
    p.add_argument(
        "--dtype", default=None, choices=tuple(DTYPES), help="default: float32 on a CPU, else bfloat16"
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed repeats of each variant; medians are reported"
    )
    p.add_argument("--variants", default=None, help=f"comma-separated from: {', '.join(VARIANTS)} (default: the usual set for the device)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: the cores this process may use)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds allowed for each variant's warm-up/compile (default: no limit)"
    )
    p.add_argument("--no-ceilings", action="store_true", help="skip the copy bandwidth and matmul rate")
    p.add_argument(
        "--json",
        default=None,
        help="where to write the results (default: benchmarks/local/<machine>-<date>.json, git-ignored)",
    )
    p.add_argument(
        "--publish",
        action="store_true",
        help="write to benchmarks/results/<machine>-<date>.json instead, which chapters 7-8 render (a file "
        "already there is never replaced: -2, -3, ... is appended)",
    )
    p.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--peer",
        choices=("llamacpp",),
        default=None,
        help="instead: llama.cpp and minillama on the same weights in each format (F32 ... Q4_1); its "
        "options: python -m minillama bench --peer llamacpp --help",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--peer" or a.startswith("--peer=") for a in argv):  # another engine: its own options
        from .llamacpp import main as peer_main

        return peer_main(argv)
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.publish and ns.json:
        parser.error("pass --json PATH or --publish, not both")
    if ns.publish and ns.no_save:
        parser.error("--publish writes the results, --no-save writes none: pass one")
    device = torch.device(ns.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {ns.device} requested but CUDA is not available (torch {torch.__version__})"
        )
    threads = ns.threads or cores()
    report = True
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun (the tp variant): rank 0 reports
        from ..distributed import init

        mesh = init()
        report = mesh.get_local_rank() == 0
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        threads = ns.threads or max(1, cores() // mesh.size())  # the ranks share the cores
        ns.quiet, ns.no_save = ns.quiet or not report, ns.no_save or not report
    torch.set_num_threads(threads)
    where = {}  # the path is chosen once: each batch's partial results and the final ones go to one file

    def save(partial: dict):
        where.setdefault("path", ns.json or default_path(partial, publish=ns.publish))
        return save_results(partial, where["path"])

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
        on_batch=None if ns.no_save else save,
    )
    if report:
        print(table(results))
    if not ns.no_save:
        print(f"results: {save(results)}")
    return 0
