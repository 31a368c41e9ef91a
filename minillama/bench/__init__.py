"""Decode and prefill throughput against the memory roofline (chapters 7 and 8).

A decode step reads every weight once (and the KV cache written so far) to make one token per
sequence, so at batch 1 its speed limit is the memory bus: tok/s <= bandwidth / bytes per step
(`accounting.decode_step_bytes`). This package measures how close minillama comes, what each step of
the recipe of pytorch-labs/gpt-fast buys, and the same generation in Hugging Face `transformers` on
the same weights, in one run:

    results = bench.run("tiny", batches=(1, 4), variants="eager,static,compile,hf")
    print(bench.table(results)); bench.plot_results(results, kind="waterfall")

Where things live, measuring apart from what is measured and from reporting:
- `timing.py`: device-synchronised spans (CUDA events on a GPU, `perf_counter` on a CPU), time limits;
- `ceilings.py`: the copy, matvec and matmul ceilings of this machine, and prefill FLOPs;
- `machine.py`: what the run was on; `models.py`: the model measured and its Hugging Face peer;
- `variants.py`: the variants, ONE named entry each in `variants.TABLE`;
- `runner.py`: `run` — warm-ups timed apart, interleaved repeats, medians and roofline figures;
- `results.py`: ratios, the headline, merging parts, JSON load/save; `report.py`: table and plots;
- `cli.py` (and `__main__.py`): `python -m minillama bench`;
- `llamacpp.py`: llama.cpp as the peer on the same weights written as GGUF (`bench --peer llamacpp`).

Adding a variant (a quantised model, speculative decoding, tensor parallelism, ...): write a runner —
an object with `compiled` and `run(tokens, rows, new_tokens, warm) -> variants.Timed` — and add one
row `"name": Variant("minillama", lambda model, hf, device: YourRunner(...))` to `variants.TABLE`.
`run`, the CLI's `--variants`, the JSON, the table and the plots pick it up by name.
"""

from .ceilings import copy_bandwidth, matmul_flops, matvec_seconds, prefill_flops
from .cli import main
from .machine import machine_info
from .models import build_model, hf_peer
from .report import plain_log_ticks, plot_results, table
from .results import (
    LOCAL,
    RESULTS,
    default_path,
    fresh_path,
    headline,
    load_results,
    merge_results,
    ratios,
    save_results,
)
from .runner import DTYPES, run
from .variants import ALIASES, QUANTISED, TABLE, VARIANTS, WATERFALL, Timed, Variant, default_variants

__all__ = [
    "ALIASES",
    "DTYPES",
    "LOCAL",
    "QUANTISED",
    "RESULTS",
    "TABLE",
    "VARIANTS",
    "WATERFALL",
    "Timed",
    "Variant",
    "build_model",
    "copy_bandwidth",
    "default_path",
    "default_variants",
    "fresh_path",
    "headline",
    "hf_peer",
    "load_results",
    "machine_info",
    "main",
    "matmul_flops",
    "matvec_seconds",
    "merge_results",
    "plain_log_ticks",
    "plot_results",
    "prefill_flops",
    "ratios",
    "run",
    "save_results",
    "table",
]
