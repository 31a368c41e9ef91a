"""The ceilings a measurement is held against, measured in the same run on the same weights (chapters 7-8).

  matvec   x @ W.T for every weight matrix of the model at the run's batch, nothing else: the time a
           decode step cannot beat on a CPU (its practical roofline; a CPU streams a large matrix-vector
           product slower than it copies memory)
  copy     a large copy, 2 · bytes / time: the device's bandwidth (on a GPU the roofline's ceiling)
  matmul   a square matrix product in the run's dtype: the FLOP rate prefill MFU is measured against

and `prefill_flops`, the FLOPs a prefill does. Not here: the variants measured against them
(`variants.py`) or the roofline figures derived (`runner.py`).
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from ..accounting import count_parameters, flops_per_token
from ..config import ModelArgs
from .timing import mark, spans


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
        marks = [mark(device)]
        for _ in range(steps):
            for x, w in zip(xs, weights):
                x @ w.T
        marks.append(mark(device))
    return spans(marks)[0] / steps


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int | None = None, steps: int = 5) -> float:
    """Bytes per second of a large `dst.copy_(src)`, counting the read and the write (2 · bytes / time).
    Default sizes (512 MiB on a CPU, beyond its caches; 2 GiB on a GPU)."""
    device = torch.device(device)
    nbytes = nbytes or (2 * 2**30 if device.type == "cuda" else 512 * 2**20)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    marks = [mark(device)]
    for _ in range(steps):
        dst.copy_(src)
        marks.append(mark(device))
    return 2 * src.numel() * 4 / statistics.median(spans(marks))


def matmul_flops(device: torch.device | str = "cpu", dtype=torch.bfloat16, n: int | None = None) -> float:
    """FLOP/s of an n × n × n matrix product (2n³ FLOPs) in `dtype`: the rate prefill MFU is taken against."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    a @ b
    steps = 10 if device.type == "cuda" else 3
    marks = [mark(device)]
    for _ in range(steps):
        a @ b
        marks.append(mark(device))
    return 2 * n**3 / statistics.median(spans(marks))


def prefill_flops(args: ModelArgs, prompt_len: int, batch: int = 1) -> int:
    """FLOPs of a prefill that computes logits for the last position only: every position's products
    through the blocks (attention over its own prefix), the output head once."""
    head = 2 * count_parameters(args).output
    per_row = sum(flops_per_token(args, context=i + 1) for i in range(prompt_len)) - (prompt_len - 1) * head
    return batch * per_row
