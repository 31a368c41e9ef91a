"""Device-synchronised time (chapters 7-8).

A span is measured between marks: CUDA events on a GPU (no sync until the last mark is read),
`time.perf_counter` on a CPU. `wall` drains the device before and after, for warm-ups and compiles;
`time_limit` stops a warm-up that runs too long. Not here: what is timed (`ceilings.py`, `variants.py`).
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time

import torch


def mark(device: torch.device):
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def spans(marks: list) -> list[float]:
    """Seconds between consecutive marks (waits for the device once, at the last mark)."""
    if isinstance(marks[0], float):
        return [b - a for a, b in itertools.pairwise(marks)]
    marks[-1].synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(device: torch.device, fn):
    """(seconds, result) of fn(), the device drained before and after: for warm-ups and compiles."""
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str):
    """Raise TimeoutError in this thread after `seconds` (POSIX main thread only; else no limit)."""
    usable = (
        seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
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
