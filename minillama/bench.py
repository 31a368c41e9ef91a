"""Decode and prefill throughput against the memory roofline (chapters 7 and 8).

A decode step reads every weight once (and the KV cache written so far) to make one token per
sequence, so at batch 1 its speed limit is the memory bus: tok/s <= bandwidth / bytes per step
(`accounting.decode_step_bytes`). This module measures how close minillama comes, what each step of
the recipe of pytorch-labs/gpt-fast buys, and the same generation in Hugging Face `transformers` on
the same weights, in one run.

Variants (names for `--variants`):
  eager                    `prefill` + `decode_one_token` with int positions: each step reads only the
                           cache rows written so far (its shapes grow, as a dynamic cache's do)
  static                   the same with tensor positions: every step has the same shapes and reads the
                           whole static cache under a mask (what torch.compile and CUDA graphs need)
  compile                  static + `torch.compile(decode_one_token, fullgraph=True)`, mode "default"
  compile-reduce-overhead  mode "reduce-overhead": CUDA graphs on a GPU (on a CPU: as "default")
  compile-max-autotune     mode "max-autotune": autotuned matmul kernels (slow to compile)
  compile-prefill          compile, and `prefill` compiled too
  generate                 `ml.generate` end to end: the public loop (tensor positions, stop checks)
  hf                       `LlamaForCausalLM.generate`, its default (dynamic) cache
  hf-static                `generate(cache_implementation="static")`, compilation disabled
  hf-compile               static cache + transformers' own torch.compile (reduce-overhead on a GPU)

Ceilings, measured in the same run on the same weights:
  matvec   x @ W.T for every weight matrix of the model at the run's batch, nothing else: the time a
           decode step cannot beat on a CPU (its practical roofline; a CPU streams a large matrix-vector
           product slower than it copies memory)
  copy     a large copy, 2 · bytes / time: the device's bandwidth (on a GPU the roofline's ceiling)
  matmul   a square matrix product in the run's dtype: the FLOP rate prefill MFU is measured against

Timing: warm-up runs (with compilation) are timed apart from the steady state; every span is
device-synchronised (CUDA events on a GPU, `time.perf_counter` on a CPU); repeats are interleaved
across variants, so a noisy neighbour slows all of them alike, and each figure is a median.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import math
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from . import __version__
from .accounting import count_parameters, decode_step_bytes, flops_per_token, weight_bytes
from .config import MODELS, ModelArgs
from .generate import decode_one_token, generate, prefill
from .model import random_model

VARIANTS = (
    "eager",
    "static",
    "compile",
    "compile-reduce-overhead",
    "compile-max-autotune",
    "compile-prefill",
    "generate",
    "hf",
    "hf-static",
    "hf-compile",
)
ALIASES = {"compile-default": "compile"}
COMPILE_MODES = {
    "compile": "default",
    "compile-reduce-overhead": "reduce-overhead",
    "compile-max-autotune": "max-autotune",
    "compile-prefill": "default",
}
# the order the chapters' waterfall adds them in
WATERFALL = ("eager", "static", "compile", "compile-reduce-overhead")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RESULTS = Path("benchmarks") / "results"
# HF's copy of the weights goes through `save` + `from_pretrained` up to this size, in memory above it
HF_VIA_DISK_BYTES = 2 * 2**30


# ----------------------------------------------------------------------------------------------------------
# the machine


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def machine_info(device: torch.device | str = "cpu") -> dict:
    """What the numbers were measured on: CPU model and cores, the GPU, library versions, the date."""
    device = torch.device(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    try:
        import transformers

        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    now = datetime.now(timezone.utc)  # noqa: UP017 (datetime.UTC needs python 3.11)
    name = gpu or f"{_cpu_name()}, {cores} cores"
    return {
        "name": name,
        "slug": _slug(gpu or f"{_cpu_name()} {cores}c"),
        "device": device.type,
        "cpu": _cpu_name(),
        "cores": cores,
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        if gpu
        else None,
        "cuda": torch.version.cuda if gpu else None,
        "torch": torch.__version__,
        "transformers": hf_version,
        "minillama": __version__,
        "python": platform.python_version(),
        "date": now.date().isoformat(),
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


# ----------------------------------------------------------------------------------------------------------
# device-synchronised time


def _mark(device: torch.device):
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _spans(marks: list) -> list[float]:
    """Seconds between consecutive marks (waits for the device once, at the last mark)."""
    if isinstance(marks[0], float):
        return [b - a for a, b in itertools.pairwise(marks)]
    marks[-1].synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wall(device: torch.device, fn):
    """(seconds, result) of fn(), the device drained before and after: for warm-ups and compiles."""
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


@contextlib.contextmanager
def _time_limit(seconds: float | None, what: str):
    """Raise TimeoutError in this thread after `seconds` (POSIX main thread only; else no limit)."""
    usable = seconds and hasattr(signal, "setitimer") and _main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{what} ran past its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------------------------------------
# ceilings


def matvec_seconds(model: nn.Module, batch: int = 1, steps: int = 16) -> float:
    """Seconds per step of `x @ W.T` for every weight matrix of the model (the embedding is a lookup,
    not a product), `steps` times in a row: the weight traffic of a decode step and nothing else."""
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    device, dtype = weights[0].device, weights[0].dtype
    generator = torch.Generator(device=device).manual_seed(0)
    xs = [torch.randn(batch, w.shape[1], device=device, dtype=dtype, generator=generator) for w in weights]
    with torch.no_grad():
        for x, w in zip(xs, weights):  # warm: first-touch and kernel selection out of the timing
            x @ w.T
        marks = [_mark(device)]
        for _ in range(steps):
            for x, w in zip(xs, weights):
                x @ w.T
        marks.append(_mark(device))
    return _spans(marks)[0] / steps


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int | None = None, steps: int = 5) -> float:
    """Bytes per second of a large `dst.copy_(src)`, counting the read and the write (2 · bytes / time).
    Default sizes (512 MiB on a CPU, beyond its caches; 2 GiB on a GPU)."""
    device = torch.device(device)
    nbytes = nbytes or (2 * 2**30 if device.type == "cuda" else 512 * 2**20)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    marks = [_mark(device)]
    for _ in range(steps):
        dst.copy_(src)
        marks.append(_mark(device))
    return 2 * src.numel() * 4 / statistics.median(_spans(marks))


def matmul_flops(device: torch.device | str = "cpu", dtype=torch.bfloat16, n: int | None = None) -> float:
    """FLOP/s of an n × n × n matrix product (2n³ FLOPs) in `dtype`: the rate prefill MFU is taken against."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    a @ b
    steps = 10 if device.type == "cuda" else 3
    marks = [_mark(device)]
    for _ in range(steps):
        a @ b
        marks.append(_mark(device))
    return 2 * n**3 / statistics.median(_spans(marks))


def prefill_flops(args: ModelArgs, prompt_len: int, batch: int = 1) -> int:
    """FLOPs of a prefill that computes logits for the last position only: every position's products
    through the blocks (attention over its own prefix), the output head once."""
    head = 2 * count_parameters(args).output
    per_row = sum(flops_per_token(args, context=i + 1) for i in range(prompt_len)) - (prompt_len - 1) * head
    return batch * per_row


# ----------------------------------------------------------------------------------------------------------
# models


def build_model(model: str | ModelArgs | os.PathLike, device, dtype, seed: int = 0, max_seq_len=None):
    """A model to measure: a `MODELS` name or `ModelArgs` (random weights, seeded), or a checkpoint folder."""
    if isinstance(model, ModelArgs) or model in MODELS:
        args = MODELS[model] if isinstance(model, str) else model
        return random_model(args, device, dtype, seed)
    if Path(model).is_dir():
        from .checkpoint import load

        return load(model, device=device, dtype=dtype, progress=False, max_seq_len=max_seq_len)
    raise ValueError(
        f"model {str(model)!r} is neither a catalogue name ({', '.join(MODELS)}) nor a checkpoint folder"
    )


def hf_peer(model: nn.Module):
    """Hugging Face's `LlamaForCausalLM` holding `model`'s weights, on its device and dtype, with
    transformers' default attention. Written by `ml.save` (HF names, wq/wk permuted to HF's rotary
    layout) and read by `from_pretrained`; above a few GiB the same tensors are handed over in memory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from .checkpoint import hf_config, hf_permute, meta_to_hf, save

    w = model.output.weight
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config-range notes about tiny configs, load reports
    hf_logging.disable_progress_bar()
    try:
        if weight_bytes(model.args, w.element_size()) <= HF_VIA_DISK_BYTES:
            with tempfile.TemporaryDirectory() as folder:
                save(model, folder)
                hf = LlamaForCausalLM.from_pretrained(folder, dtype=w.dtype).to(w.device)
        else:
            a = model.args
            with torch.device(w.device):
                hf = LlamaForCausalLM._from_config(LlamaConfig(**hf_config(a, w.dtype)), dtype=w.dtype)
            heads = {"attention.wq.weight": a.n_heads, "attention.wk.weight": a.n_kv_heads}
            state = {}
            for name, t in model.state_dict().items():
                n = next((h for suffix, h in heads.items() if name.endswith(suffix)), None)
                state[meta_to_hf(name)] = hf_permute(t, n) if n else t
            hf.load_state_dict(state, strict=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    # no end-of-text stop: both sides generate exactly the tokens asked for (minillama's bench loop has
    # no stop check either), which also spares HF its per-step check
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


# ----------------------------------------------------------------------------------------------------------
# one generation, timed


class _Loop:
    """How a minillama variant runs: the step and prefill functions and the kind of position."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        self.tensor_pos = name != "eager"
        mode = COMPILE_MODES.get(name)
        self.compiled = mode is not None
        self.cudagraphs = mode == "reduce-overhead" and device.type == "cuda"
        self.step = torch.compile(decode_one_token, mode=mode, fullgraph=True) if mode else decode_one_token
        self.prefill = prefill
        if name == "compile-prefill":
            self.prefill = torch.compile(prefill, fullgraph=True, dynamic=False)

    def run(self, model, tokens: torch.Tensor, new_tokens: int, warm: bool = False):
        """Prefill `tokens` `[b, t]` and decode to `new_tokens` new tokens per row. Returns (prefill_s,
        decode_s, tokens `[b, new_tokens]`); `warm`: also (first prefill s, first step s) wall times."""
        b, t = tokens.shape
        device = self.device
        lengths = torch.full((b,), t, device=device)
        pos = lengths.clone() if self.tensor_pos else t
        firsts = []
        marks = [_mark(device)]
        if warm:
            seconds, (token, _) = _wall(device, lambda: self.prefill(model, tokens, lengths))
            firsts.append(seconds)
        else:
            token, _ = self.prefill(model, tokens, lengths)
        marks.append(_mark(device))
        out = [token]
        if self.compiled and b > 1:
            # one graph for every batch size above 1 (size 1 is always its own): the batch sweep
            # compiles once more, not once per size
            torch._dynamo.mark_dynamic(token, 0)
            torch._dynamo.mark_dynamic(pos, 0)
        for i in range(new_tokens - 1):
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            if warm and i == 0:
                seconds, (token, _) = _wall(device, lambda token=token, pos=pos: self.step(model, token, pos))
                firsts.append(seconds)
            else:
                token, _ = self.step(model, token, pos)
            if self.cudagraphs:
                token = token.clone()  # the graph's output buffer is rewritten by the next replay
            out.append(token)
            pos += 1
        marks.append(_mark(device))
        prefill_s, decode_s = _spans(marks)
        return prefill_s, decode_s, torch.cat(out, dim=1), firsts


def _generate_once(model, rows: list[list[int]], new_tokens: int, device):
    marks = [_mark(device)]
    out = generate(model, rows, max_new_tokens=new_tokens, temperature=0.0)
    marks.append(_mark(device))
    return _spans(marks)[0], torch.tensor(out, device=device)


def _hf_kwargs(variant: str, device: torch.device) -> dict:
    from transformers import CompileConfig

    kwargs = {"do_sample": False}
    if variant == "hf-static":
        kwargs.update(cache_implementation="static", disable_compile=True)
    elif variant == "hf-compile":
        config = CompileConfig(fullgraph=False)
        if device.type != "cuda":  # transformers compiles on accelerators only unless told to
            config = CompileConfig(fullgraph=False, mode="default")
            config._compile_all_devices = True
        kwargs.update(cache_implementation="static", compile_config=config)
    return kwargs


class _StepMarks:
    """A logits processor that only marks the time (a CUDA event on a GPU: no sync) each time
    `generate` has new logits: once after prefill, then once per decode step."""

    def __init__(self, device: torch.device):
        self.device, self.marks = device, []

    def __call__(self, input_ids, scores):
        self.marks.append(_mark(self.device))
        return scores


def _hf_once(hf, tokens: torch.Tensor, new_tokens: int, kwargs: dict, device):
    """(prefill s, decode s, new tokens) of one `generate`: prefill is the start to the first logits
    (setup included), decode the first logits to the last, `new_tokens` - 1 steps, as minillama's."""
    from transformers import LogitsProcessorList

    steps = _StepMarks(device)
    start = _mark(device)
    out = hf.generate(
        tokens,
        attention_mask=torch.ones_like(tokens),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        logits_processor=LogitsProcessorList([steps]),
        **kwargs,
    )
    end = _mark(device)
    spans = _spans([start, steps.marks[0], steps.marks[-1], end])
    return spans[0], spans[1] + spans[2], out[:, tokens.shape[1] :]


# ----------------------------------------------------------------------------------------------------------
# the benchmark


def _variant_list(variants) -> list[str]:
    if isinstance(variants, str):
        variants = [v for v in variants.split(",") if v]
    names = []
    for v in variants:
        v = ALIASES.get(v.strip(), v.strip())
        if v not in VARIANTS:
            raise ValueError(
                f"unknown variant {v!r}; valid variants: {', '.join(VARIANTS)} (or compile-default)"
            )
        if v not in names:
            names.append(v)
    if not names:
        raise ValueError(f"no variants given; pick from {', '.join(VARIANTS)}")
    return names


def default_variants(device: torch.device | str) -> list[str]:
    if torch.device(device).type == "cuda":
        return ["eager", "static", "compile", "compile-reduce-overhead", "generate", "hf", "hf-compile"]
    return ["eager", "static", "compile", "generate", "hf", "hf-static"]


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
    dict that `main` writes as JSON (see the module docstring for the variants and the ceilings).

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
    variants = _variant_list(variants or default_variants(device))
    if repeats < 1 or prompt_len < 1 or new_tokens < 2 or min(batches) < 1:
        raise ValueError(
            f"need repeats >= 1, prompt_len >= 1, new_tokens >= 2 and batches >= 1; got repeats={repeats}, "
            f"prompt_len={prompt_len}, new_tokens={new_tokens}, batches={batches}"
        )
    seq_len = prompt_len + new_tokens
    started = time.perf_counter()
    known = model if isinstance(model, ModelArgs) else MODELS.get(model) if isinstance(model, str) else None
    if known is not None and seq_len > known.max_seq_len:
        raise ValueError(
            f"prompt_len + new_tokens = {seq_len} exceeds the model's max_seq_len={known.max_seq_len}; "
            f"shorten them or pass ModelArgs with a larger max_seq_len"
        )
    net = build_model(model, device, dtype, seed, max_seq_len=seq_len)
    args = net.args
    say(f"{args.name}: {count_parameters(args).total:,} parameters, {dtype}, on {device}")
    hf = None
    if any(v.startswith("hf") for v in variants):
        try:
            hf = hf_peer(net)
        except ImportError as error:
            raise ValueError(
                f"the hf variants need transformers ({error}); pip install transformers"
            ) from None
    machine = machine_info(device)
    element = net.output.weight.element_size()
    # the decode steps of one generation attend to prompt_len + 1 .. prompt_len + new_tokens - 1 keys
    context = prompt_len + new_tokens // 2
    out = {
        "schema": 1,
        "machine": machine,
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
            "context": context,
            "repeats": repeats,
            "variants": variants,
            "seed": seed,
            "hf_attention": hf.config._attn_implementation if hf is not None else None,
        },
        "ceilings": {},
        "runs": [],
    }
    # the cache holds the largest batch; a smaller batch uses its first rows, so the buffers keep
    # their shapes across the sweep (a compiled step then recompiles once, for a dynamic batch size)
    net.setup_cache(max(batches), seq_len)
    loops = {v: _Loop(v, device) for v in variants if not v.startswith("hf") and v != "generate"}
    generator = torch.Generator().manual_seed(seed)
    # no_grad rather than inference_mode: CUDA graphs and compiled steps are best trodden there (gpt-fast)
    with torch.no_grad(), torch._dynamo.config.patch(cache_size_limit=64):
        if ceilings:
            out["ceilings"] = {
                "copy_bytes_per_s": copy_bandwidth(device),
                "matmul_flops": matmul_flops(device, dtype),
                "matmul_dtype": str(dtype).removeprefix("torch."),
            }
            say(
                f"copy {out['ceilings']['copy_bytes_per_s'] / 1e9:.1f} GB/s, "
                f"{out['ceilings']['matmul_dtype']} matmul {out['ceilings']['matmul_flops'] / 1e12:.2f} TFLOP/s"
            )
        for b in batches:
            tokens = torch.randint(0, args.vocab_size, (b, prompt_len), generator=generator).to(device)
            rows = tokens.tolist()
            records, reference = {}, None
            for v in variants:
                rec = records[v] = {
                    "variant": v,
                    "impl": "hf" if v.startswith("hf") else "minillama",
                    "batch": b,
                }
                try:
                    with _time_limit(timeout, f"the warm-up of {v} at batch {b}"):
                        warm_s, result = _wall(
                            device,
                            lambda v=v, tokens=tokens, rows=rows: _once(
                                v, net, hf, loops, tokens, rows, new_tokens, device, warm=True
                            ),
                        )
                    rec["warmup_s"] = warm_s
                    if v in loops and loops[v].compiled:
                        rec["compile_s"] = sum(result[3])  # the first (compiling) prefill and step calls
                    generated = result[-2] if v in loops else result[-1]
                    if reference is None and rec["impl"] == "minillama":
                        reference = generated
                    rec["generated"] = generated
                    rec["times"] = {"prefill": [], "decode": [], "generate": []}
                except Exception as error:  # noqa: BLE001 (any failure of one variant, e.g. a compile error, is recorded)
                    rec["error"] = (
                        f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                    )
                    say(f"batch {b} {v}: {rec['error']}")
            live = [v for v in variants if "error" not in records[v]]
            for r in range(repeats):
                for v in (
                    live[r % len(live) :] + live[: r % len(live)]
                ):  # a rotating order: no variant always first
                    _record(records[v], _once(v, net, hf, loops, tokens, rows, new_tokens, device))
                matvec = matvec_seconds(net, b, steps=min(new_tokens - 1, 32))
                for v in live:
                    records[v].setdefault("times", {}).setdefault("matvec", []).append(matvec)
            for v in variants:
                rec = records[v]
                if "error" not in rec:
                    _summarise(
                        rec, args, b, prompt_len, new_tokens, context, element, out["ceilings"], device
                    )
                    gen = rec.pop("generated")
                    if reference is not None:
                        n = min(gen.shape[1], reference.shape[1])
                        rec["same_tokens"] = bool(torch.equal(gen[:, :n].cpu(), reference[:, :n].cpu()))
                    say(_line(rec))
                out["runs"].append(rec)
            if on_batch is not None:
                elapsed = time.perf_counter() - started
                on_batch({**out, "ratios": ratios(out), "headline": headline(out), "wall_s": elapsed})
    out["ratios"] = ratios(out)
    out["headline"] = headline(out)
    out["wall_s"] = time.perf_counter() - started
    return out


def _once(v, net, hf, loops, tokens, rows, new_tokens, device, warm=False):
    if v in loops:
        return loops[v].run(net, tokens, new_tokens, warm=warm)
    if v == "generate":
        return _generate_once(net, rows, new_tokens, device)
    return _hf_once(hf, tokens, new_tokens, _hf_kwargs(v, device), device)


def _record(rec: dict, result) -> None:
    times = rec["times"]
    if rec["variant"] == "generate":
        times["generate"].append(result[0])
    elif rec["impl"] == "hf":
        prefill_s, decode_s, _ = result
        times["prefill"].append(prefill_s)
        times["decode"].append(decode_s)
        times["generate"].append(prefill_s + decode_s)
    else:
        prefill_s, decode_s = result[0], result[1]
        times["prefill"].append(prefill_s)
        times["decode"].append(decode_s)
        times["generate"].append(prefill_s + decode_s)


def _summarise(rec, args, b, prompt_len, new_tokens, context, element, ceilings, device) -> None:
    """Medians and the figures derived from them, in place."""
    times = rec["times"]
    med = {k: statistics.median(v) for k, v in times.items() if v}
    steps = new_tokens - 1
    rec["bytes_per_step"] = decode_step_bytes(args, context, b, element)
    rec["context"] = context
    rec["generate_ms"] = med["generate"] * 1e3
    rec["generate_tok_s"] = b * new_tokens / med["generate"]
    matvec_s = med["matvec"]
    rec["matvec_ms"] = matvec_s * 1e3
    memory_tok_s = b / matvec_s
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


def ratios(results: dict) -> list[dict]:
    """minillama over HF, generate tok/s and decode tok/s, for every pair of variants at each batch."""
    rows = []
    for b in results["config"]["batches"]:
        runs = [r for r in results["runs"] if r["batch"] == b and "error" not in r]
        for ours in (r for r in runs if r["impl"] == "minillama"):
            for theirs in (r for r in runs if r["impl"] == "hf"):
                row = {"batch": b, "minillama": ours["variant"], "hf": theirs["variant"]}
                row["generate"] = ours["generate_tok_s"] / theirs["generate_tok_s"]
                if ours.get("part") == theirs.get("part"):  # measured in the same run
                    # repeat by repeat (the variants of a repeat run back to back), then the median
                    pairs = zip(ours["times_ms"]["generate"], theirs["times_ms"]["generate"])
                    row["generate_paired"] = statistics.median(t / o for o, t in pairs)
                if "decode_tok_s" in ours and "decode_tok_s" in theirs:
                    row["decode"] = ours["decode_tok_s"] / theirs["decode_tok_s"]
                rows.append(row)
    return rows


def headline(results: dict) -> dict | None:
    """At the smallest batch: minillama's fastest variant over HF's fastest, by generate tok/s (end to
    end, prefill included, the same tokens), and minillama's `generate` over HF's default `generate`."""
    b = min(results["config"]["batches"])
    runs = [r for r in results["runs"] if r["batch"] == b and "error" not in r]
    ours = [r for r in runs if r["impl"] == "minillama"]
    if not ours:
        return None
    best = max(ours, key=lambda r: r["generate_tok_s"])
    head = {"batch": b, "minillama": best["variant"], "generate_tok_s": best["generate_tok_s"]}
    if "decode_tok_s" in best:
        head["roofline_fraction"] = best["roofline_fraction"]
        head["step_over_matvec"] = best["step_over_matvec"]
    theirs = [r for r in runs if r["impl"] == "hf"]
    if theirs:
        peer = max(theirs, key=lambda r: r["generate_tok_s"])
        head.update(hf=peer["variant"], hf_generate_tok_s=peer["generate_tok_s"])
        head["ratio"] = best["generate_tok_s"] / peer["generate_tok_s"]
    rows = results.get("ratios") or ratios(results)
    pair = {(r["minillama"], r["hf"]): r for r in rows if r["batch"] == b}
    if theirs and "generate_paired" in pair[(best["variant"], peer["variant"])]:
        head["ratio_paired"] = pair[(best["variant"], peer["variant"])]["generate_paired"]
    if ("generate", "hf") in pair:
        head["generate_over_hf"] = pair[("generate", "hf")]["generate"]
    return head


def merge_results(parts: list[dict]) -> dict:
    """One results dict from runs of the same model, dtype and lengths on one machine, e.g. the GPU
    script's parts, each run in its own process under its own time limit (the same seed gives the same
    weights). Runs are concatenated (a variant and batch measured twice keeps its first measurement),
    ratios and the headline recomputed across parts."""
    if not parts:
        raise ValueError("nothing to merge: pass at least one results dict")
    first = parts[0]
    keys = ("model", "dtype", "prompt_len", "new_tokens", "seed")
    for p in parts[1:]:
        differ = [k for k in keys if p["config"][k] != first["config"][k]]
        if p["machine"]["name"] != first["machine"]["name"]:
            differ.append("machine")
        if differ:
            raise ValueError(f"cannot merge results that differ in {', '.join(differ)}")
    out = json.loads(json.dumps(first))
    seen, runs, variants = set(), [], []
    for i, p in enumerate(parts):
        for r in p["runs"]:
            if (r["variant"], r["batch"]) not in seen:
                seen.add((r["variant"], r["batch"]))
                runs.append({**r, "part": i})
        variants += [v for v in p["config"]["variants"] if v not in variants]
    out["runs"] = runs
    out["config"]["variants"] = variants
    out["config"]["batches"] = sorted({b for p in parts for b in p["config"]["batches"]})
    out["config"]["repeats"] = max(p["config"]["repeats"] for p in parts)
    out["parts"] = [
        {k: p["config"][k] for k in ("variants", "batches", "repeats")} | {"wall_s": p.get("wall_s")}
        for p in parts
    ]
    out["ratios"] = ratios(out)
    out["headline"] = headline(out)
    out["wall_s"] = sum(p.get("wall_s") or 0 for p in parts)
    return out


# ----------------------------------------------------------------------------------------------------------
# reading, printing and plotting results


def _line(rec: dict) -> str:
    parts = [f"batch {rec['batch']:>3} {rec['variant']:<24}"]
    if "decode_tok_s" in rec:
        parts.append(
            f"decode {rec['decode_tok_s']:9.1f} tok/s {rec['decode_ms_per_token']:8.2f} ms/token "
            f"{rec['achieved_bytes_per_s'] / 1e9:7.1f} GB/s {100 * rec['roofline_fraction']:5.1f}% of roofline "
            f"{rec['step_over_matvec']:5.2f}x matvec"
        )
    parts.append(f"generate {rec['generate_tok_s']:9.1f} tok/s")
    if "prefill_tok_s" in rec:
        parts.append(f"prefill {rec['prefill_ms']:8.2f} ms")
    if rec.get("compile_s") is not None:
        parts.append(f"compile {rec['compile_s']:.1f} s")
    return "  ".join(parts)


def table(results: dict) -> str:
    """The results as text: the machine, the ceilings, a line per run, the headline ratio."""
    m, c = results["machine"], results["config"]
    lines = [
        (
            f"{c['model']} ({c['parameters']:,} parameters) {c['dtype']}, prompt {c['prompt_len']} + "
            f"{c['new_tokens']} new tokens, median of {c['repeats']}; {m['name']}, torch {m['torch']}"
        )
    ]
    ceil = results.get("ceilings") or {}
    if ceil:
        lines.append(
            f"copy bandwidth {ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s, {ceil['matmul_dtype']} matmul "
            f"{ceil['matmul_flops'] / 1e12:.2f} TFLOP/s"
        )
    for rec in results["runs"]:
        if "error" in rec:
            lines.append(f"batch {rec['batch']:>3} {rec['variant']:<24}{rec['error']}")
            continue
        lines.append(_line(rec))
    for b in c["batches"]:
        rec = next((r for r in results["runs"] if r["batch"] == b and "matvec_ms" in r), None)
        if rec:
            lines.append(
                f"batch {b:>3} ceilings: matvec {rec['matvec_ms']:.2f} ms/step ({b / rec['matvec_ms'] * 1e3:.1f} tok/s), "
                f"{rec['bytes_per_step'] / 1e6:.1f} MB/step, roofline ({rec['roofline']}) {rec['roofline_tok_s']:.1f} tok/s"
            )
    head = results.get("headline")
    if head and "ratio" in head:
        lines.append(
            f"headline (batch {head['batch']}): minillama {head['minillama']} {head['generate_tok_s']:.1f} tok/s "
            f"/ HF {head['hf']} {head['hf_generate_tok_s']:.1f} tok/s = {head['ratio']:.2f}x"
            + (f" (paired by repeat {head['ratio_paired']:.2f}x)" if "ratio_paired" in head else "")
            + (
                f"; ml.generate / HF generate = {head['generate_over_hf']:.2f}x"
                if "generate_over_hf" in head
                else ""
            )
        )
    return "\n".join(lines)


def default_path(results: dict) -> Path:
    m = results["machine"]
    return RESULTS / f"{m['slug']}-{m['date']}.json"


def save_results(results: dict, path: str | os.PathLike | None = None) -> Path:
    path = Path(path) if path is not None else default_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def load_results(pattern: str = "benchmarks/results/*.json") -> list[dict]:
    """Committed results matching `pattern` (a glob), oldest first. A relative pattern is tried from
    the working directory, then from the repository this package sits in (notebooks run in notebooks/)."""
    paths = sorted(glob.glob(pattern))
    if not paths and not os.path.isabs(pattern):
        paths = sorted(glob.glob(str(Path(__file__).resolve().parent.parent / pattern)))
    results = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if isinstance(r, dict) and "runs" in r and "machine" in r:
            results.append(r)
    return sorted(results, key=lambda r: r["machine"].get("time", r["machine"]["date"]))


def _label(results: dict) -> str:
    c = results["config"]
    return f"{c['model']}, {c['dtype']}, on {results['machine']['name']}"


def plot_results(results: dict, kind: str = "variants", batch: int | None = None, ax=None):
    """A matplotlib figure of one results dict.

    kind "variants": decode tok/s of every variant at `batch` (default the smallest) against the
    roofline; "waterfall": what each step (eager -> static cache -> compiled -> CUDA graphs) adds;
    "batch": tok/s and ms/token against batch size for each minillama variant, with the roofline."""
    import matplotlib.pyplot as plt

    if kind not in ("variants", "waterfall", "batch"):
        raise ValueError(f"kind={kind!r}; use 'variants', 'waterfall' or 'batch'")
    runs = [r for r in results["runs"] if "error" not in r]
    if kind == "batch":
        return _plot_batch(results, runs, ax)
    b = batch if batch is not None else min(results["config"]["batches"])
    runs = [r for r in runs if r["batch"] == b and "decode_tok_s" in r]
    if not runs:
        raise ValueError(f"no decode measurements at batch {b} in these results")
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100) if ax is None else (ax.figure, ax)
    roof = runs[0]["roofline_tok_s"]
    if kind == "variants":
        names = [r["variant"] for r in runs]
        values = [r["decode_tok_s"] for r in runs]
        colors = ["tab:orange" if r["impl"] == "hf" else "tab:blue" for r in runs]
        ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.0f} ({100 * v / roof:.0f}%)", va="center", fontsize=8)
        ax.axvline(roof, color="k", ls="--", lw=1, label=f"roofline ({runs[0]['roofline']}) {roof:.0f} tok/s")
        if runs[0]["roofline"] == "matvec" and "copy_roofline_tok_s" in runs[0]:
            copy = runs[0]["copy_roofline_tok_s"]
            ax.axvline(copy, color="gray", ls=":", lw=1, label=f"copy bandwidth {copy:.0f} tok/s")
        ax.set_xlabel("decode throughput (tokens/s)")
        ax.set_ylabel("variant")
        ax.set_xlim(0, max(values + [roof]) * 1.3)
        ax.set_title(f"Decode at batch {b}: {_label(results)}", fontsize=9)
        ax.legend(loc="lower right", fontsize=8)
    else:
        by = {r["variant"]: r for r in runs}
        steps = [v for v in WATERFALL if v in by]
        if not steps:
            raise ValueError(f"the waterfall needs some of {', '.join(WATERFALL)}; these results have none")
        prev = 0.0
        for i, v in enumerate(steps):
            val = by[v]["decode_tok_s"]
            color = "tab:blue" if i == 0 else ("tab:green" if val >= prev else "tab:red")
            ax.bar(i, val - prev if i else val, bottom=prev if i else 0, color=color)
            ax.text(i, max(val, prev), f"{val:.0f}", ha="center", va="bottom", fontsize=8)
            prev = val
        ax.axhline(roof, color="k", ls="--", lw=1, label=f"roofline ({runs[0]['roofline']}) {roof:.0f} tok/s")
        ax.set_xticks(range(len(steps)), [_WATERFALL_LABELS[v] for v in steps], fontsize=8)
        ax.set_xlabel("optimisation, each added to the one before")
        ax.set_ylabel("decode throughput (tokens/s)")
        ax.set_ylim(0, max(roof, prev) * 1.15)
        ax.set_title(f"What each step buys at batch {b}: {_label(results)}", fontsize=9)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


_WATERFALL_LABELS = {
    "eager": "eager",
    "static": "+ static cache",
    "compile": "+ torch.compile",
    "compile-reduce-overhead": "+ CUDA graphs",
}


def _plot_batch(results, runs, ax):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(7, 3.5), dpi=100)
    else:
        fig, ax2 = ax.figure, None
    # the variants measured at more than one batch size
    names = [
        v
        for v in results["config"]["variants"]
        if len({r["batch"] for r in runs if r["variant"] == v and "decode_tok_s" in r}) > 1
    ]
    if not names:
        raise ValueError("no variant was measured at more than one batch size in these results")
    for v in names:
        rs = sorted((r for r in runs if r["variant"] == v and "decode_tok_s" in r), key=lambda r: r["batch"])
        bs = [r["batch"] for r in rs]
        ax.plot(bs, [r["decode_tok_s"] for r in rs], "o-", ms=3, label=v)
        if ax2 is not None:
            ax2.plot(bs, [r["decode_ms_per_token"] for r in rs], "o-", ms=3, label=v)
    roof = sorted({r["batch"]: r["roofline_tok_s"] for r in runs}.items())
    ax.plot([b for b, _ in roof], [t for _, t in roof], "k--", lw=1, label="roofline")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.legend(fontsize=7)
    if ax2 is not None:
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("batch size (sequences)")
        ax2.set_ylabel("time per decode step (ms)")
    fig.suptitle(f"Batch sweep: {_label(results)}", fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------
# the command line


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
    threads = ns.threads or (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    )
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


if __name__ == "__main__":
    sys.exit(main())
