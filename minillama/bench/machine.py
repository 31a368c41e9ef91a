"""What a benchmark ran on: the CPU model and cores, the GPU, the library versions, the date (chapters 7-8).

Not here: timing (`timing.py`) or anything measured.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

import torch

from .. import __version__


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b|@.*", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def cores() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_info(device: torch.device | str = "cpu") -> dict:
    """What the numbers were measured on: CPU model and cores, the GPU, library versions, the date."""
    device = torch.device(device)
    n_cores = cores()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    try:
        import transformers

        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    now = datetime.now(timezone.utc)  # noqa: UP017 (datetime.UTC needs python 3.11)
    name = gpu or f"{_cpu_name()}, {n_cores} cores"
    return {
        "name": name,
        "slug": _slug(gpu or f"{_cpu_name()} {n_cores}c"),
        "device": device.type,
        "cpu": _cpu_name(),
        # the vector instructions PyTorch's CPU kernels use here: the same model name ("AMD EPYC") covers
        # CPUs with AVX-512 and without, whose bf16 and int4 kernels differ (chapter 8)
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "cores": n_cores,
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
