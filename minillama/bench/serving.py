"""Serving under load: static batching, the engine, prefix sharing and transformers' continuous
batching on one workload (chapter 12).

A workload is a list of requests arriving over time: exponential gaps between arrivals (a Poisson
process of `rate` requests per second), prompt and output lengths drawn uniformly from stated ranges,
all from one seed; optionally every prompt starts with the same system prompt. Each server replays it
on a `Clock` and records, for every request, when it arrived and when each of its tokens came out.

The clock is this process's CPU time (`time.process_time`, all its threads), plus the idle gaps it
skips: when a server has nothing to do until the next arrival, the clock jumps there instead of
sleeping. On a machine shared with other work, wall time measures the neighbours as much as the
server (a step here took anywhere from one to three times its unloaded time within a minute); CPU time
counts only the work this process did. Run with one thread (`torch.set_num_threads(1)`), so CPU time is
the time of the one stream of work. On an idle machine or a GPU, `Clock(wall=True)` is wall time.

- "static": `ml.generate` on a batch of everything that has arrived (up to `max_batch`) whenever the
  previous batch is done; a batch is padded to its longest prompt and runs until its longest output.
  Token times come from a hook on the decode step, so static batching is credited as if it streamed;
- "engine": `ml.Engine` stepped in a loop, requests added as they arrive (prefix sharing off);
- "engine+prefix": the same with prefix sharing (on the shared-system-prompt workload it matters);
- "hf-cb": transformers' continuous batching manager (`init_continuous_batching`, the machinery of
  `generate_batch`), fed the same requests at the same times from this thread while its own thread
  generates; its streamed tokens are stamped when this thread receives them (polled every 5 ms).

Metrics: output tokens per second over the run (first arrival to last token), time to first token
and inter-token gaps (p50 / p99, milliseconds), and the KV cache each one holds: bytes allocated
at the fullest moment vs the bytes of positions actually written.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..accounting import kv_cache_bytes
from ..decode import decode_one_token
from ..generate import generate
from ..serving import Engine, SamplingParams


@dataclass(frozen=True)
class Request:
    arrival: float  # seconds after the start
    prompt: list[int]
    max_tokens: int


@dataclass
class Served:
    arrival: float
    times: list[float] = field(default_factory=list)  # seconds after the start, one per token
    tokens: list[int] = field(default_factory=list)


def poisson_workload(
    n: int, rate: float, prompt_lens=(16, 128), output_lens=(8, 64), vocab: int = 128_256, seed: int = 0,
    shared_prefix: int = 0,
) -> list[Request]:  # fmt: skip
    """n requests, exponential gaps of mean 1 / rate seconds, lengths uniform in the closed ranges;
    `shared_prefix` tokens (one draw) start every prompt, counted inside its length range plus the prefix."""
    g = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n, dtype=torch.float64).exponential_(rate, generator=g)
    arrivals = (gaps.cumsum(0) - gaps[0]).tolist()  # the first request arrives at 0
    # the prefix from its own generator: with and without it, the requests are otherwise the same
    prefix = torch.randint(
        0, vocab, (shared_prefix,), generator=torch.Generator().manual_seed(seed + 1)
    ).tolist()
    out = []
    for t in arrivals:
        p = int(torch.randint(prompt_lens[0], prompt_lens[1] + 1, (1,), generator=g))
        m = int(torch.randint(output_lens[0], output_lens[1] + 1, (1,), generator=g))
        out.append(Request(t, prefix + torch.randint(0, vocab, (p,), generator=g).tolist(), m))
    return out


class Clock:
    """Seconds since the start: CPU time of this process (or wall time) plus the idle gaps skipped."""

    def __init__(self, wall: bool = False):
        self.read = time.perf_counter if wall else time.process_time
        self.wall, self.start, self.skipped = wall, self.read(), 0.0

    def now(self) -> float:
        return self.read() - self.start + self.skipped

    def skip_to(self, t: float) -> None:
        """Nothing to do until t: jump there (wall time sleeps)."""
        if (gap := t - self.now()) > 0:
            if self.wall:
                time.sleep(gap)
            else:
                self.skipped += gap


def run_static(
    model, workload: list[Request], max_batch: int = 16, wall: bool = False
) -> tuple[list[Served], dict]:
    """Static batching with `ml.generate`: each batch waits for the previous one and for its longest output."""
    served = [Served(r.arrival) for r in workload]
    pending = deque(range(len(workload)))
    per_position = kv_cache_bytes(
        model.args, positions=1, batch=1, bytes_per_value=model.tok_embeddings.weight.element_size()
    )
    peak = {"allocated": 0, "used": 0}
    clock = Clock(wall)
    while pending:
        clock.skip_to(workload[pending[0]].arrival)
        now = clock.now()
        batch = []
        while pending and workload[pending[0]].arrival <= now and len(batch) < max_batch:
            batch.append(pending.popleft())
        stamps = []

        def step(*args, stamps=stamps, **kw):
            if not stamps:
                stamps.append(clock.now())  # prefill done: the first tokens exist
            out = decode_one_token(*args, **kw)
            stamps.append(clock.now())
            return out

        longest = max(workload[i].max_tokens for i in batch)
        prompts = [workload[i].prompt for i in batch]
        model.clear_cache()  # a cache sized for this batch, as a static server allocates it
        out = generate(model, prompts, max_new_tokens=longest, decode_step=step)
        if not stamps:
            stamps.append(clock.now())
        positions = max(len(p) for p in prompts) + longest - 1
        if len(batch) * positions > peak["allocated"]:
            used = sum(len(workload[i].prompt) + workload[i].max_tokens - 1 for i in batch)
            peak = {"allocated": len(batch) * positions, "used": used}
        for i, row in zip(batch, out, strict=True):
            m = workload[i].max_tokens
            served[i].tokens, served[i].times = row[:m], stamps[:m]
    model.clear_cache()
    return served, {
        "kv_bytes_allocated": peak["allocated"] * per_position,
        "kv_bytes_used": peak["used"] * per_position,
    }


def run_engine(model, workload: list[Request], wall: bool = False, **engine_kw) -> tuple[list[Served], dict]:
    """`ml.Engine`, requests added at their arrival times, stepped until everything is served."""
    engine = Engine(model, **engine_kw)
    served = [Served(r.arrival) for r in workload]
    ids: dict[int, int] = {}
    pending = deque(range(len(workload)))
    per_block = engine.runner.bytes_per_block
    per_position = per_block // engine.block_size
    peak = {"allocated": 0, "used": 0}
    clock = Clock(wall)
    while pending or engine.has_unfinished():
        if not engine.has_unfinished():
            clock.skip_to(workload[pending[0]].arrival)
        now = clock.now()
        while pending and workload[pending[0]].arrival <= now:
            i = pending.popleft()
            ids[engine.add_request(workload[i].prompt, SamplingParams(max_tokens=workload[i].max_tokens))] = i
        outputs = engine.step()
        t = clock.now()
        for o in outputs:
            if o.token is not None:
                served[ids[o.request_id]].tokens.append(o.token)
                served[ids[o.request_id]].times.append(t)
        used_blocks = engine.num_blocks - engine.free_blocks
        if used_blocks * per_block > peak["allocated"]:
            # positions written: each running sequence's cached positions (shared blocks counted once)
            held = {b for s in engine.scheduler.running for b in s.table}
            written = sum(s.computed for s in engine.scheduler.running)
            shared = sum(len(s.table) for s in engine.scheduler.running) - len(held)
            peak = {
                "allocated": used_blocks * per_block,
                "used": (written - shared * engine.block_size) * per_position,
            }
    assert engine.free_blocks == engine.num_blocks
    stats = engine.stats()
    stats.update({"kv_bytes_peak_allocated": peak["allocated"], "kv_bytes_peak_used": peak["used"]})
    return served, stats


def run_hf_cb(hf, workload: list[Request], max_batch: int = 16, max_batch_tokens: int = 256, block_size: int = 16,
              num_blocks: int = 1024, prefix_sharing: bool = False, wall: bool = False) -> tuple[list[Served], dict]:  # fmt: skip
    """transformers' continuous batching manager, fed the requests at their arrival times; tokens streamed."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(
        do_sample=False, max_new_tokens=max(r.max_tokens for r in workload), eos_token_id=-1
    )
    cb = ContinuousBatchingConfig(
        page_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_batch, allow_block_sharing=prefix_sharing, use_cuda_graph=False,
    )  # fmt: skip
    manager = hf.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
    served = [Served(r.arrival) for r in workload]
    ids, pending, finished = {}, deque(range(len(workload))), 0
    manager.start()
    try:
        clock = Clock(wall)
        while finished < len(workload):
            if pending and finished == len(
                ids
            ):  # all it was given is done: nothing runs until the next arrival
                clock.skip_to(workload[pending[0]].arrival)
            while pending and workload[pending[0]].arrival <= clock.now():
                i = pending.popleft()
                rid = manager.add_request(
                    workload[i].prompt,
                    request_id=f"r{i}",
                    max_new_tokens=workload[i].max_tokens,
                    streaming=True,
                )
                ids[rid] = i
            while (result := manager.get_result(timeout=0)) is not None:
                s, now = served[ids[result.request_id]], clock.now()
                new = list(result.generated_tokens)
                s.times += [now] * (len(new) - len(s.tokens))
                s.tokens = new
                finished += result.is_finished()
            if manager.background_thread_status.fatal_error is not None:
                raise RuntimeError("transformers' continuous batching stopped with an error")
            time.sleep(0.005)
    finally:
        manager.stop(block=True, timeout=30)
    return served, {}


def _pct(values: list[float], q: float) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q)) if values else float("nan")


def summarize(served: list[Served]) -> dict:
    """Throughput and latencies of one run (milliseconds for latencies)."""
    first = min(s.arrival for s in served)
    last = max(s.times[-1] for s in served)
    tokens = sum(len(s.tokens) for s in served)
    ttft = [1e3 * (s.times[0] - s.arrival) for s in served]
    gaps = [1e3 * (b - a) for s in served for a, b in zip(s.times, s.times[1:])]
    return {
        "output_tokens": tokens,
        "seconds": last - first,
        "tokens_per_s": tokens / (last - first),
        "ttft_ms_p50": _pct(ttft, 0.5),
        "ttft_ms_p99": _pct(ttft, 0.99),
        "itl_ms_p50": _pct(gaps, 0.5),
        "itl_ms_p99": _pct(gaps, 0.99),
    }


def compare(model, hf=None, *, n: int = 24, rate: float = 2.0, prompt_lens=(16, 64), output_lens=(8, 64),
            shared_prefix: int = 64, max_batch: int = 8, block_size: int = 16, max_tokens_per_step: int = 256,
            seed: int = 0, wall: bool = False, log=print) -> dict:  # fmt: skip
    """Every server on the same workload, in one run: the mixed workload for static batching, the engine
    and transformers' continuous batching (`hf`, when given), then the same requests behind a shared
    system prompt of `shared_prefix` tokens for the engine with and without prefix sharing.
    Returns summaries, ratios, the greedy-identity counts and the KV memory of each."""
    vocab = model.args.vocab_size
    mixed = poisson_workload(n, rate, prompt_lens, output_lens, vocab, seed)
    shared = poisson_workload(n, rate, prompt_lens, output_lens, vocab, seed, shared_prefix=shared_prefix)
    longest = max(prompt_lens) + shared_prefix + max(output_lens)
    num_blocks = max_batch * -(-longest // block_size)  # enough for max_batch of the longest requests
    kw = {"max_batch": max_batch, "block_size": block_size, "num_blocks": num_blocks,
          "max_tokens_per_step": max_tokens_per_step}  # fmt: skip
    runs: dict[str, tuple[list[Served], dict]] = {}
    plan = [
        ("static", mixed, lambda w: run_static(model, w, max_batch, wall)),
        ("engine", mixed, lambda w: run_engine(model, w, wall, prefix_sharing=False, **kw)),
        (
            "hf-cb",
            mixed,
            lambda w: run_hf_cb(hf, w, max_batch, max_tokens_per_step, block_size, num_blocks, wall=wall),
        ),
        ("engine-shared", shared, lambda w: run_engine(model, w, wall, prefix_sharing=False, **kw)),
        ("engine+prefix-shared", shared, lambda w: run_engine(model, w, wall, prefix_sharing=True, **kw)),
    ]
    for name, workload, fn in plan:
        if name == "hf-cb" and hf is None:
            continue
        runs[name] = fn(workload)
        log(f"{name}: {summarize(runs[name][0])}")
    out = {"variants": {}, "identical": {}}
    for name, (served, extra) in runs.items():
        out["variants"][name] = {**summarize(served), **extra}
    reference = [s.tokens for s in runs["static"][0]]
    for name in ("engine", "hf-cb"):
        if name in runs:
            out["identical"][name] = sum(s.tokens == r for s, r in zip(runs[name][0], reference, strict=True))
    out["identical"]["engine+prefix-shared"] = sum(
        a.tokens == b.tokens
        for a, b in zip(runs["engine+prefix-shared"][0], runs["engine-shared"][0], strict=True)
    )
    v = out["variants"]
    out["ratios"] = {
        "engine_over_static": v["engine"]["tokens_per_s"] / v["static"]["tokens_per_s"],
        "prefix_over_engine_shared": v["engine+prefix-shared"]["tokens_per_s"]
        / v["engine-shared"]["tokens_per_s"],
        "prefill_saved_fraction": v["engine+prefix-shared"]["prefill_tokens_saved"]
        / sum(len(r.prompt) for r in shared),
        "shared_fraction": (shared_prefix // block_size * block_size)
        / (sum(len(r.prompt) for r in shared) / n),
    }
    if "hf-cb" in v:
        out["ratios"]["engine_over_hf_cb"] = v["engine"]["tokens_per_s"] / v["hf-cb"]["tokens_per_s"]
    out["workload"] = {"n": n, "rate_per_s": rate, "prompt_lens": list(prompt_lens), "output_lens": list(output_lens),
                       "shared_prefix": shared_prefix, "seed": seed, "max_batch": max_batch, "block_size": block_size,
                       "num_blocks": num_blocks, "max_tokens_per_step": max_tokens_per_step,
                       "clock": "wall" if wall else "process CPU time"}  # fmt: skip
    out["arrivals"] = [r.arrival for r in mixed]
    out["requests"] = [[len(r.prompt), r.max_tokens] for r in mixed]
    return out


def budget_sweep(model, budgets=(32, 64, 256), *, n: int = 24, rate: float = 2.0, prompt_lens=(16, 64),
                 output_lens=(8, 64), shared_prefix: int = 64, max_batch: int = 8, block_size: int = 16,
                 seed: int = 0, wall: bool = False, log=print) -> dict:  # fmt: skip
    """The engine alone at several `max_tokens_per_step` budgets, in one run, on `compare`'s two workloads
    (the mixed one and the one behind a shared system prompt, prefix sharing off): how the time to first
    token and the inter-token gaps move with the budget. Returns {"mixed"|"shared": {budget: summary}}."""
    vocab = model.args.vocab_size
    longest = max(prompt_lens) + shared_prefix + max(output_lens)
    kw = {"max_batch": max_batch, "block_size": block_size, "num_blocks": max_batch * -(-longest // block_size)}
    out: dict = {"budgets": list(budgets)}
    for name, prefix in (("mixed", 0), ("shared", shared_prefix)):
        workload = poisson_workload(n, rate, prompt_lens, output_lens, vocab, seed, shared_prefix=prefix)
        out[name] = {}
        for b in budgets:
            served, stats = run_engine(model, workload, wall, prefix_sharing=False, max_tokens_per_step=b, **kw)
            out[name][str(b)] = {**summarize(served), "steps": stats["steps"]}
            log(f"{name} budget {b}: {out[name][str(b)]}")
    return out
