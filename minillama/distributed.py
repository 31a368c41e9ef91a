"""Tensor parallelism on torch.distributed: one model across N devices (chapter 11).

Megatron-LM's split of a transformer block (Shoeybi et al. 2019, "Megatron-LM: training multi-billion
parameter language models using model parallelism", section 3): the projections that fan out
(wq, wk, wv; w1, w3) are cut by output features, "column-parallel", so each rank computes whole heads
and a slice of the SwiGLU width with no communication; the projections that fan back in (wo, w2) are
cut by input features, "row-parallel", so each rank's product is a partial sum of the full result and
one all-reduce per sub-layer adds them up. Two all-reduces of `[b, t, d]` per block, nothing else. The
embedding and the output head are cut along the vocabulary: a rank looks up only its own rows (an
all-reduce assembles them) and computes the logits of its own slice of v (an all-gather joins them).

Nothing here is home-made: PyTorch's DTensor does the cutting and the collectives. `tp_plan` is the
plan as data (module name -> `ColwiseParallel` / `RowwiseParallel`) and `parallelize_module` applies
it, as torchtitan does for Llama (pytorch/torchtitan `torchtitan/models/llama3/infra/parallelize.py`,
`apply_tp`) and PyTorch's tensor-parallel tutorial teaches; pytorch-labs/gpt-fast `tp.py` does the
same cut by hand. Pinned lines: `minillama.sources` keys "tp-tutorial", "torchtitan-tp", "gpt-fast-tp".

Axes (the book's): N ranks on a 1-D `DeviceMesh`; a rank holds h / N query heads and kv / N KV heads.
Meta's head order `(kv g)` keeps a KV head's g query heads next to each other, so the rank that gets
rows [r·h/N·hd, (r+1)·h/N·hd) of wq gets exactly the query heads of its kv / N KV heads: attention
runs per rank unchanged, sizing itself from its projections' widths (`Attention.forward`), and each
rank's KV cache holds only its own heads (`Attention.local_kv_heads`). N must divide n_kv_heads
(8 for all Llama 3.1 sizes): a KV head cannot be split between ranks without splitting its group.

    mesh = torch.distributed.device_mesh.init_device_mesh("cuda", (N,))
    ml.parallelize(model, mesh)          # in place; ml.generate works unchanged
    torchrun --nproc-per-node N -m minillama generate --checkpoint DIR --prompt "..." --tp N

`spawn` runs a function on N local CPU ranks (gloo on 127.0.0.1, with timeouts): the tests and the
chapter use it to check the parallel model against the single-process one.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_module
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from .config import ModelArgs

COLUMN = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROW = ("attention.wo", "feed_forward.w2")


def tp_plan(n_layers: int) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of a Llama model with `n_layers` blocks, module name -> style.

    Column-parallel layers keep their output sharded by features (`Shard(-1)`, handed to the next op as
    the rank's local tensor); row-parallel layers take that local tensor and all-reduce their partial
    sums to a replicated output. Norms and the rotary tables are replicated: every rank holds them whole.
    """
    plan: dict[str, ParallelStyle] = {
        # vocabulary-parallel embedding: rank r holds rows of tokens in its slice of v; the others
        # contribute zeros and one all-reduce gives every rank the full [b, t, d]
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        # vocabulary-parallel head: each rank computes the logits of its slice of v; an all-gather joins them
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(n_layers):
        plan.update({f"layers.{i}.{name}": ColwiseParallel() for name in COLUMN})
        plan.update({f"layers.{i}.{name}": RowwiseParallel() for name in ROW})
    return plan


def shard_dim(name: str) -> int | None:
    """The weight dim that `tp_plan` cuts for parameter `name` (None: replicated). Column-parallel
    weights `[out, in]` and the embedding `[v, d]` are cut along dim 0, row-parallel ones along dim 1;
    these are the dims along which Meta's fairscale shards are cut too (`checkpoint/read_meta.py`)."""
    module = name.removesuffix(".weight")
    if module in ("tok_embeddings", "output") or module.endswith(COLUMN):
        return 0
    if module.endswith(ROW):
        return 1
    return None


def local_range(size: int, degree: int, rank: int) -> tuple[int, int]:
    """(start, length) of rank `rank`'s slice when `size` rows are cut into `degree` pieces the way
    DTensor's `Shard` does (torch.chunk: pieces of ceil(size / degree), the last ones shorter)."""
    step = -(-size // degree)
    start = min(rank * step, size)
    return start, min(step, size - start)


def check_degree(args: ModelArgs, degree: int) -> None:
    """Raise a ValueError when `degree` ranks cannot share `args`'s heads evenly."""
    if degree < 1:
        raise ValueError(f"tensor-parallel degree {degree} must be at least 1")
    if args.n_kv_heads % degree:
        divisors = [n for n in range(1, args.n_kv_heads + 1) if args.n_kv_heads % n == 0]
        raise ValueError(
            f"tensor-parallel degree {degree} does not divide n_kv_heads={args.n_kv_heads}: each rank must hold "
            f"whole KV heads, each with the g = {args.n_rep} query heads that read it; use a degree in {divisors}"
        )


def parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Make `model` (a `Transformer`) tensor-parallel over the 1-D `mesh`, in place, and return it.

    Every rank must call it with the same model (same weights: each keeps only its slices) and then
    run the same calls on it, since each forward runs collectives that every rank joins. Weights
    already on the meta device stay there (load them afterwards, as `ml.load(path, mesh=mesh)` does)."""
    if mesh.ndim != 1:
        raise ValueError(f"parallelize takes a 1-D DeviceMesh (tensor parallelism only); got {mesh.ndim}-D")
    check_degree(model.args, mesh.size())
    cache = model.cache_shape
    model.clear_cache()  # a cache sized for all KV heads is wrong on a rank: rebuilt below
    tied = model.output.weight is model.tok_embeddings.weight
    if tied:  # one v × d matrix (Llama 3.2 1B/3B): the plan cuts both uses along v, so cut it once
        model.output.weight = nn.Parameter(model.output.weight.detach(), requires_grad=False)
    parallelize_module(model, mesh, tp_plan(model.args.n_layers))
    if tied:
        model.output.weight = model.tok_embeddings.weight  # the same Shard(0) DTensor serves both
    if cache is not None:
        model.setup_cache(*cache)
    return model


# -- launching ranks ----------------------------------------------------------------------------


def _loopback() -> str | None:
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in names if n.startswith("lo")), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, timeout, results, args):
    try:
        # gloo binds to the interface its hostname resolves to: pin it to the loopback device
        if (lo := _loopback()) is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        torch.set_num_threads(1)  # N ranks share the cores
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        mesh = init_device_mesh("cpu", (world_size,))
        results.put((rank, True, fn(mesh, *args)))
    except BaseException:  # noqa: BLE001 (reported to the parent, which raises)
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, world_size: int = 2, *args, timeout: float = 120.0) -> list:
    """Run `fn(mesh, *args)` on `world_size` CPU ranks (gloo, 127.0.0.1 only) and return each rank's
    result, rank 0 first. `fn` must be importable (a module-level function) and its results picklable.
    A rank that fails raises RuntimeError with its traceback; ranks that do not finish within `timeout`
    seconds (e.g. one rank waiting in a collective the others never join) are killed and TimeoutError
    is raised, so a bug cannot hang the caller."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, rank, world_size, port, timeout, results, args), daemon=True)
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout
    try:
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:
                    raise RuntimeError(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{world_size - len(out)} of {world_size} ranks did not finish within {timeout} s "
                        f"(a collective that not every rank joined?)"
                    ) from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world_size)]


def init(degree: int | None = None, timeout: float = 600.0) -> DeviceMesh:
    """Under `torchrun`: join the process group (NCCL on GPUs, one per local rank; gloo on CPUs) and
    return the 1-D tensor-parallel mesh of all ranks. `degree`, when given, must equal the world size."""
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if not world:
        raise ValueError(
            "no torchrun environment (WORLD_SIZE is unset): launch with "
            "`torchrun --nproc-per-node N -m minillama generate ... --tp N`"
        )
    if degree is not None and degree != world:
        raise ValueError(f"--tp {degree} must equal the number of ranks torchrun started ({world})")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout))
    return init_device_mesh("cuda" if cuda else "cpu", (world,))


# -- what chapter 11 runs on each rank --------------------------------------------------------------


def _times_ms(fn, repeats: int) -> list[float]:
    """`repeats` timings of `fn` in ms, fastest first, after one warm-up call (DTensor caches its sharding
    decisions on the first call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(1e3 * t for t in times)


def _median_ms(fn, repeats: int) -> float:
    times = _times_ms(fn, repeats)
    return times[len(times) // 2]


def demo(mesh: DeviceMesh, args: ModelArgs, seed: int = 0, new_tokens: int = 8, repeats: int = 20) -> dict:
    """On each rank: a random model of `args` made parallel over `mesh`, against the same model whole.
    Returns the rank's local shapes (block 0 and its cache), the largest logit differences (full
    forward, prefill, cached decode), both greedy continuations, both sampled ones with one seed on every
    rank and the parallel one with a seed per rank (`seed + 1 + rank`), the median and the fastest times of
    one decode step (whole and parallel), the median time of one all-reduce of `[1, 1, d]` float32 on this
    process group, and the number of threads the rank's torch runs on."""
    from .generate import generate
    from .model import random_model

    single, model = random_model(args, seed=seed), parallelize(random_model(args, seed=seed), mesh)
    tokens = torch.randint(0, args.vocab_size, (1, 8), generator=torch.Generator().manual_seed(seed))
    out: dict = {"rank": mesh.get_local_rank()}
    with torch.inference_mode():
        errors = {}
        for name, call in {
            "full forward": lambda m: m(tokens),
            "prefill": lambda m: m(tokens, start_pos=0),
            "decode (int position)": lambda m: m(tokens[:, :1], start_pos=8),
            "decode (tensor position)": lambda m: m(tokens[:, :1], start_pos=torch.tensor(9)),
        }.items():
            if name == "prefill":
                single.setup_cache(1, 32)
                model.setup_cache(1, 32)
            errors[name] = (call(model) - call(single)).abs().max().item()
        out["errors"] = errors
        block = model.layers[0]
        out["shapes"] = {
            name: tuple(p.to_local().shape if hasattr(p, "to_local") else p.shape)
            for name, p in block.named_parameters()
        }
        out["cache"] = tuple(block.attention.cache.k.shape)
        out["greedy"] = [
            generate(m, [tokens[0].tolist()], max_new_tokens=new_tokens)[0] for m in (single, model)
        ]
        # sampling at temperature 0.8: with the same seed on every rank (and on the whole model), and with
        # a seed that differs between ranks, so that the ranks feed different tokens into the collectives
        sample = {"max_new_tokens": new_tokens, "temperature": 0.8}
        out["sampled"] = [generate(m, [tokens[0].tolist()], seed=seed + 1, **sample)[0] for m in (single, model)]
        out["sampled_seed_per_rank"] = generate(
            model, [tokens[0].tolist()], seed=seed + 1 + out["rank"], **sample
        )[0]
        pos = torch.tensor(20)
        from torch.distributed.tensor.debug import CommDebugMode

        with CommDebugMode() as comm:  # the collectives DTensor issues in one decode step
            model(tokens[:, :1], start_pos=pos)
        out["collectives"] = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
        steps = {
            "whole model, this process": _times_ms(lambda: single(tokens[:, :1], start_pos=pos), repeats),
            "tensor-parallel": _times_ms(lambda: model(tokens[:, :1], start_pos=pos), repeats),
        }
        out["step_ms"] = {name: times[len(times) // 2] for name, times in steps.items()}
        out["step_fastest_ms"] = {name: times[0] for name, times in steps.items()}
    out["threads"] = torch.get_num_threads()
    x = torch.ones(1, 1, args.dim)
    out["all_reduce_ms"] = _median_ms(lambda: dist.all_reduce(x), 5 * repeats)
    return out


def checkpoint_demo(mesh: DeviceMesh, path: str, prompt: list[int], new_tokens: int = 4) -> dict:
    """On each rank: the checkpoint at `path` (Meta's or Hugging Face's layout) loaded tensor-parallel over
    `mesh` in float32, each rank reading only its own slices (`load(path, mesh=mesh)`). Returns the rank's
    local shapes of block 0, the full logits after `prompt` (a list of v floats, joined by the head's all-gather), the
    greedy continuation of `new_tokens` tokens, the seconds it took, and the number of threads the rank's
    torch runs on. Every rank runs the same calls."""
    from .checkpoint import load
    from .generate import generate

    model = load(path, dtype=torch.float32, progress=False, mesh=mesh)
    block = model.layers[0]
    out: dict = {"rank": mesh.get_local_rank(), "threads": torch.get_num_threads()}
    out["shapes"] = {
        name: tuple(p.to_local().shape if hasattr(p, "to_local") else p.shape)
        for name, p in block.named_parameters()
    }
    with torch.inference_mode():
        # a list, not a tensor: torch's queues pass tensors as shared memory, gone once the rank exits
        out["logits"] = model(torch.tensor([prompt]))[0, -1].tolist()
        start = time.perf_counter()
        out["greedy"] = generate(
            model, [prompt], max_new_tokens=new_tokens, max_seq_len=len(prompt) + new_tokens
        )[0]
        out["seconds"] = time.perf_counter() - start
    return out


# -- the command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m minillama.distributed [--nproc 2] [--model tiny]`: the chapter's check, N CPU ranks
    (gloo on 127.0.0.1) against one process. Text generation on N ranks is `python -m minillama generate
    --tp N`, launched by torchrun."""
    import argparse

    from .config import MODELS

    parser = argparse.ArgumentParser(prog="python -m minillama.distributed", description=main.__doc__)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    opts = parser.parse_args(argv)
    for r in spawn(demo, opts.nproc, MODELS[opts.model].replace(n_layers=2), timeout=300):
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
