"""Running a benchmark and recording what it measured (chapters 7-8).

`run` builds the model (and its Hugging Face peer when an hf variant is asked for), measures the
ceilings, then per batch size warms every variant up (compilation timed apart, under a time limit),
times `repeats` interleaved repeats (a rotating order, so a noisy neighbour slows all variants alike;
the matvec ceiling right after each repeat), and reduces each variant to medians and the roofline
figures derived from them. Every span is device-synchronised (`timing.py`). Not here: the variants
themselves (`variants.py`), combining and storing results (`results.py`), printing them (`report.py`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import time
from pathlib import Path

import torch

from ..accounting import count_parameters, decode_step_bytes, flops_per_token
from ..config import MODELS, ModelArgs
from .ceilings import copy_bandwidth, matmul_flops, matvec_seconds, prefill_flops
from .machine import machine_info
from .models import build_model, hf_peer
from .report import line
from .results import headline, ratios
from .timing import time_limit, wall
from .variants import TABLE, default_variants, variant_list

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_transformers(variants: list[str]) -> None:
    """Before anything is built: the hf variants need transformers; say which to leave out."""
    peers = [v for v in variants if TABLE[v].impl == "hf"]
    if peers and importlib.util.find_spec("transformers") is None:
        ours = [v for v in variants if TABLE[v].impl != "hf"] or ["eager", "static", "compile", "generate"]
        raise ValueError(
            f"the Hugging Face variants ({', '.join(peers)}) need transformers, which is not installed: "
            f"pip install transformers, or measure minillama alone with --variants {','.join(ours)}"
        )


def run(
    model: str | ModelArgs | os.PathLike = "tiny",
    batches=(1,),
    prompt_len: int = 32,
    new_tokens: int = 64,
    dtype: str | torch.dtype = "float32",
    repeats: int = 5,
    variants=None,
    device: str | torch.device | None = None,
    seed: int = 0,
    timeout: float | None = None,
    ceilings: bool = True,
    log=None,
    on_batch=None,
) -> dict:
    """Measure prefill and decode throughput of each variant at each batch size; returns the results
    dict that `main` writes as JSON (see `variants.py` for the variants, `ceilings.py` for the ceilings).

    `model`: a `MODELS` name or `ModelArgs` (random weights from `seed`), or a checkpoint folder.
    `timeout`: seconds allowed for each variant's warm-up (compilation); past it the variant is
    recorded with an error and left out. `log`: a callable for progress lines (None: silent).
    `on_batch`: called with the results so far after each batch size (`main` saves them, so a run
    stopped from outside keeps the batches it finished)."""
    say = log or (lambda line: None)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    batches = sorted({int(b) for b in (batches.split(",") if isinstance(batches, str) else batches)})
    variants = variant_list(variants or default_variants(device))
    _check(model, batches, prompt_len, new_tokens, repeats)
    _check_transformers(variants)
    seq_len = prompt_len + new_tokens
    started = time.perf_counter()
    extra = max(TABLE[v].extra_positions for v in variants)
    net = build_model(model, device, dtype, seed, max_seq_len=seq_len + extra)
    say(f"{net.args.name}: {count_parameters(net.args).total:,} parameters, {dtype}, on {device}")
    hf = None
    if any(TABLE[v].impl == "hf" for v in variants):
        try:
            hf = hf_peer(net)
        except ImportError as error:
            raise ValueError(
                f"the hf variants need transformers ({error}); pip install transformers"
            ) from None
    out = _header(model, net, hf, device, dtype, batches, prompt_len, new_tokens, repeats, variants, seed)
    # the cache holds the largest batch; a smaller batch uses its first rows, so the buffers keep
    # their shapes across the sweep (a compiled step then recompiles once, for a dynamic batch size)
    # (speculative variants write k positions past the last new token)
    net.setup_cache(max(batches), seq_len + extra)
    runners = {v: TABLE[v].make(net, hf, device) for v in variants}
    generator = torch.Generator().manual_seed(seed)
    # no_grad rather than inference_mode: CUDA graphs and compiled steps are best trodden there (gpt-fast)
    with torch.no_grad(), torch._dynamo.config.patch(cache_size_limit=64):
        if ceilings:
            out["ceilings"] = _ceilings(device, dtype, say)
        for b in batches:
            tokens = torch.randint(0, net.args.vocab_size, (b, prompt_len), generator=generator).to(device)
            out["runs"] += _measure_batch(out, net, runners, tokens, repeats, timeout, device, say)
            if on_batch is not None:
                elapsed = time.perf_counter() - started
                on_batch({**out, "ratios": ratios(out), "headline": headline(out), "wall_s": elapsed})
    out["ratios"] = ratios(out)
    out["headline"] = headline(out)
    out["wall_s"] = time.perf_counter() - started
    return out


def _check(model, batches, prompt_len, new_tokens, repeats) -> None:
    if repeats < 1 or prompt_len < 1 or new_tokens < 2 or min(batches) < 1:
        raise ValueError(
            f"need repeats >= 1, prompt_len >= 1, new_tokens >= 2 and batches >= 1; got repeats={repeats}, "
            f"prompt_len={prompt_len}, new_tokens={new_tokens}, batches={batches}"
        )
    seq_len = prompt_len + new_tokens
    known = model if isinstance(model, ModelArgs) else MODELS.get(model) if isinstance(model, str) else None
    if known is not None and seq_len > known.max_seq_len:
        raise ValueError(
            f"prompt_len + new_tokens = {seq_len} exceeds the model's max_seq_len={known.max_seq_len}; "
            f"shorten them or pass ModelArgs with a larger max_seq_len"
        )


def _header(model, net, hf, device, dtype, batches, prompt_len, new_tokens, repeats, variants, seed) -> dict:
    """The results dict before any run: the machine and the configuration."""
    args = net.args
    return {
        "schema": 1,
        "machine": machine_info(device),
        "config": {
            "model": args.name,
            # a checkpoint by its folder's name only: no machine paths in the results
            "source": "ModelArgs" if isinstance(model, ModelArgs) else Path(model).name,
            "args": {k: v for k, v in vars(args).items()},
            "parameters": count_parameters(args).total,
            "dtype": str(dtype).removeprefix("torch."),
            "batches": batches,
            "prompt_len": prompt_len,
            "new_tokens": new_tokens,
            # the decode steps of one generation attend to prompt_len + 1 .. prompt_len + new_tokens - 1 keys
            "context": prompt_len + new_tokens // 2,
            "repeats": repeats,
            "variants": variants,
            "seed": seed,
            "hf_attention": hf.config._attn_implementation if hf is not None else None,
        },
        "ceilings": {},
        "runs": [],
    }


def _ceilings(device, dtype, say) -> dict:
    ceil = {
        "copy_bytes_per_s": copy_bandwidth(device),
        "matmul_flops": matmul_flops(device, dtype),
        "matmul_dtype": str(dtype).removeprefix("torch."),
    }
    say(
        f"copy {ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s, {ceil['matmul_dtype']} matmul {ceil['matmul_flops'] / 1e12:.2f} TFLOP/s"
    )
    return ceil


def _warm_up(rec: dict, runner, tokens, rows, new_tokens, timeout, device):
    """The first (compiling) generation, timed apart; its tokens. Raises what the variant raises."""
    with time_limit(timeout, f"the warm-up of {rec['variant']} at batch {rec['batch']}"):
        warm_s, result = wall(device, lambda: runner.run(tokens, rows, new_tokens, warm=True))
    rec["warmup_s"] = warm_s
    if runner.compiled:
        rec["compile_s"] = sum(result.firsts)  # the first (compiling) prefill and step calls
    return result.tokens


def _measure_batch(out, net, runners, tokens, repeats, timeout, device, say) -> list[dict]:
    """Warm up, time and summarise every variant at one batch size; the records, in variant order."""
    b, new_tokens = tokens.shape[0], out["config"]["new_tokens"]
    rows = tokens.tolist()
    records, generated, references = {}, {}, {}
    for v, runner in runners.items():
        rec = records[v] = {"variant": v, "impl": TABLE[v].impl, "batch": b}
        if TABLE[v].quant is not None:  # a quantised copy: its own bytes, its own tokens to agree with
            rec["format"], rec["group_size"], rec["backend"] = TABLE[v].quant
        try:
            generated[v] = _warm_up(rec, runner, tokens, rows, new_tokens, timeout, device)
            if rec["impl"] == "minillama":
                references.setdefault(TABLE[v].quant, generated[v])
            rec["times"] = {"prefill": [], "decode": [], "generate": []}
        except Exception as error:  # noqa: BLE001 (any failure of one variant, e.g. a compile error, is recorded)
            rec["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            say(f"batch {b} {v}: {rec['error']}")
    live = [v for v in runners if "error" not in records[v]]
    for r in range(repeats):
        for v in live[r % len(live) :] + live[: r % len(live)]:  # a rotating order: no variant always first
            _record(records[v], runners[v].run(tokens, rows, new_tokens))
        matvec = matvec_seconds(net, b, steps=min(new_tokens - 1, 32))
        for v in live:
            records[v].setdefault("times", {}).setdefault("matvec", []).append(matvec)
    c = out["config"]
    element = net.output.weight.element_size()
    for v in live:
        rec = records[v]
        _summarise(
            rec, net.args, b, c["prompt_len"], new_tokens, c["context"], element, out["ceilings"], device
        )
        stats = getattr(runners[v], "stats", None)  # a speculative variant's last run (chapter 10)
        if stats is not None:
            rec["speculative"] = {
                "k": stats.k,
                "acceptance_rate": stats.acceptance_rate,
                "alpha": stats.alpha,
                "tokens_per_forward": stats.tokens_per_forward,
            }
        reference = references.get(TABLE[v].quant)
        if reference is not None:
            n = min(generated[v].shape[1], reference.shape[1])
            rec["same_tokens"] = bool(torch.equal(generated[v][:, :n].cpu(), reference[:, :n].cpu()))
        say(line(rec))
    return list(records.values())


def _record(rec: dict, result) -> None:
    times = rec["times"]
    if result.prefill_s is not None:
        times["prefill"].append(result.prefill_s)
        times["decode"].append(result.decode_s)
    times["generate"].append(result.generate_s)


def _summarise(rec, args, b, prompt_len, new_tokens, context, element, ceilings, device) -> None:
    """Medians and the figures derived from them, in place."""
    times = rec["times"]
    med = {k: statistics.median(v) for k, v in times.items() if v}
    steps = new_tokens - 1
    # a quantised variant reads its weights in its format (scales and zeros at the model's width)
    rec["bytes_per_step"] = decode_step_bytes(
        args, context, b, element, format=rec.get("format"), group_size=rec.get("group_size") or 128
    )
    rec["context"] = context
    rec["generate_ms"] = med["generate"] * 1e3
    rec["generate_tok_s"] = b * new_tokens / med["generate"]
    matvec_s = med["matvec"]
    rec["matvec_ms"] = matvec_s * 1e3
    memory_tok_s = b / matvec_s
    if rec.get("format"):  # the matvec ran on the 16-bit weights: scale its ceiling to the variant's bytes
        memory_tok_s *= decode_step_bytes(args, context, b, element) / rec["bytes_per_step"]
    if "copy_bytes_per_s" in ceilings:
        copy_tok_s = ceilings["copy_bytes_per_s"] * b / rec["bytes_per_step"]
        rec["copy_roofline_tok_s"] = copy_tok_s
        if device.type == "cuda":  # the GPU's ceiling is its copy bandwidth, the CPU's its matvec speed
            memory_tok_s = copy_tok_s
        rec["compute_roofline_tok_s"] = ceilings["matmul_flops"] * b / flops_per_token(args, context)
    rec["roofline"] = "copy" if device.type == "cuda" and "copy_bytes_per_s" in ceilings else "matvec"
    rec["roofline_tok_s"] = min(memory_tok_s, rec.get("compute_roofline_tok_s", math.inf))
    if "decode" in med:
        step_s = med["decode"] / steps
        rec["decode_ms_per_token"] = step_s * 1e3
        rec["decode_tok_s"] = b / step_s
        rec["achieved_bytes_per_s"] = rec["bytes_per_step"] / step_s
        rec["roofline_fraction"] = rec["decode_tok_s"] / rec["roofline_tok_s"]
        rec["step_over_matvec"] = step_s / matvec_s
        # the same ratio repeat by repeat (each repeat times the matvecs right after the variants), then
        # the median: steadier than the ratio of medians when a neighbour's load comes and goes
        rec["step_over_matvec_paired"] = statistics.median(
            d / steps / m for d, m in zip(times["decode"], times["matvec"])
        )
    if "prefill" in med:
        rec["prefill_ms"] = med["prefill"] * 1e3
        rec["prefill_tok_s"] = b * prompt_len / med["prefill"]
        if "matmul_flops" in ceilings:
            rec["prefill_mfu"] = (
                prefill_flops(args, prompt_len, b) / med["prefill"] / ceilings["matmul_flops"]
            )
    times_ms = {k: [round(t * 1e3, 4) for t in v] for k, v in times.items() if v}
    rec["times_ms"] = times_ms
    del rec["times"]
