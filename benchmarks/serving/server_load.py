"""Load on `python -m minillama serve`: requests/s held and latency percentiles at 1, 8 and 32 concurrent
streaming clients (chapter 12).

The server runs in its own process (`python -m minillama serve --model tiny`, random weights, on
127.0.0.1 and a free port), so the clients' event loop does not share its interpreter. At each level,
N clients each send one streaming completion after another (a closed loop: a client sends its next
request when the last one has ended); the clock starts when every client has finished its first
request (the warm-up) and runs `--seconds`; every request asks for `--max-tokens` greedy tokens of a
short prompt. Recorded per level: requests completed and failed,
requests/s and generated tokens/s held, latency (request sent -> `data: [DONE]`) and time to first
token at p50 / p90 / p99, and the engine's largest batch seen on /health. The JSON names the machine
and the load average around the run: on a shared machine, compare levels within one run, not runs.

    .venv/bin/python benchmarks/serving/server_load.py                      # -> benchmarks/serving/server-load-cpu.json
    .venv/bin/python benchmarks/serving/server_load.py --levels 1,32 --seconds 10 --json /tmp/x.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "The llama is",
    "Continuous batching means",
    "A key-value cache holds",
    "Once upon a time there was a server that",
    "Paged attention splits the cache into",
    "The quick brown fox",
    "In the beginning",
    "GPUs are fast because",
]


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between closest ranks (numpy's default), None if empty."""
    if not values:
        return None
    xs = sorted(values)
    at = (len(xs) - 1) * q
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(latency s, time to first token s, tokens) of one streaming completion."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif first is None and event["choices"] and event["choices"][0]["text"]:
                first = time.perf_counter()
    end = time.perf_counter()
    return end - start, (first or end) - start, tokens


async def level(url: str, clients: int, seconds: float, max_tokens: int) -> dict:
    """N closed-loop clients; the clock starts when every client has finished one request (the warm-up:
    the batch is then full and steady) and runs `seconds`; a request counts when it ends in that window."""
    done: list[tuple[float, float, int]] = []
    failures: list[str] = []
    peak = {"running": 0, "waiting": 0}
    window = {"from": float("inf"), "to": float("inf")}
    warmed = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker(i: int):
            n = 0
            while time.perf_counter() < window["to"]:
                try:
                    result = await one_request(client, PROMPTS[(i + n) % len(PROMPTS)], max_tokens)
                except Exception as error:  # counted, never hidden
                    failures.append(f"{type(error).__name__}: {error}")
                    result = None
                n += 1
                now = time.perf_counter()
                if result is not None and window["from"] <= now <= window["to"]:
                    done.append(result)
                if n == 1:
                    warmed.append(i)
                    if len(warmed) == clients:
                        window["from"], window["to"] = now, now + seconds

        async def watch():
            while time.perf_counter() < window["to"]:
                engine = (await client.get("/health")).json()["engine"]
                if window["from"] <= time.perf_counter():
                    for key in peak:
                        peak[key] = max(peak[key], engine[key])
                await asyncio.sleep(0.05)

        await asyncio.gather(watch(), *(worker(i) for i in range(clients)))
    latency = [d[0] for d in done]
    ttft = [d[1] for d in done]

    def ms(values, q):
        p = percentile(values, q)
        return None if p is None else round(p * 1e3, 1)

    return {
        "clients": clients,
        "seconds": seconds,
        "requests": len(done),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "requests_per_s": round(len(done) / seconds, 3),
        "tokens_per_s": round(sum(d[2] for d in done) / seconds, 1),
        "mean_tokens_per_request": round(statistics.mean(d[2] for d in done), 1) if done else None,
        "latency_ms": {"p50": ms(latency, 0.5), "p90": ms(latency, 0.9), "p99": ms(latency, 0.99)},
        "ttft_ms": {"p50": ms(ttft, 0.5), "p90": ms(ttft, 0.9), "p99": ms(ttft, 0.99)},
        "peak_running": peak["running"],
        "peak_waiting": peak["waiting"],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--levels", default="1,8,32", help="concurrent clients per level, comma-separated")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds per level")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=str(ROOT / "benchmarks/serving/server-load-cpu.json"))
    ns = p.parse_args(argv)
    levels = [int(x) for x in ns.levels.split(",")]

    sys.path.insert(0, str(ROOT))
    from minillama.bench.machine import machine_info

    port = free_port()
    argv = [sys.executable, "-m", "minillama", "serve", "--model", ns.model, "--port", str(port),
            "--max-batch", str(ns.max_batch), "--device", ns.device, "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    started = time.time()
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited: {server.stderr.read()}")
            try:
                health = httpx.get(url + "/health", timeout=2).json()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start within 180 s") from None
                time.sleep(0.2)
        load_before = os.getloadavg()
        results = []
        for clients in levels:
            r = asyncio.run(level(url, clients, ns.seconds, ns.max_tokens))
            results.append(r)
            print(json.dumps(r), flush=True)
        load_after = os.getloadavg()
        final = httpx.get(url + "/health", timeout=10).json()
    finally:
        server.terminate()
        server.communicate(timeout=30)
    out = {
        "schema": 1,
        "what": "python -m minillama serve under N closed-loop streaming clients (benchmarks/serving/server_load.py)",
        "machine": machine_info(ns.device),
        "server": {
            "model": ns.model,
            "weights": "random (seed 0)",
            "max_batch": ns.max_batch,
            "num_blocks": health["num_blocks"],
            "block_size": health["block_size"],
        },  # fmt: skip
        "request": {"max_tokens": ns.max_tokens, "temperature": 0, "stream": True, "prompts": PROMPTS},
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "levels": results,
        "blocks_free_after": final["free_blocks"],
        "wall_s": round(time.time() - started, 1),
    }
    Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.json).write_text(json.dumps(out, indent=1) + "\n")
    print("results:", ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
