"""The variants a benchmark measures, one named entry each in `TABLE` (chapters 7-8).

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
  tp                       static on a copy of the model split over every rank torchrun started
                           (`ml.parallelize`, chapter 11): `torchrun --nproc-per-node N -m minillama bench
                           --variants static,tp`; every rank measures, rank 0 reports. The copy needs the
                           model to fit one device twice: a comparison on the same weights, not a 70B loader
  int8, int4-gN            static on a copy quantised by `ml.quantize` (int8 per channel, int4 in groups of
                           N = 32, 64, 128, 256), eager: the layers call PyTorch's int8/int4 kernels (chapter 9)
  int8-compile             the same int8 copy, compiled (mode "default"); int4-g128-compile likewise
  torchao-int8             `ml.quantize(..., backend="torchao")`, compiled as torchao intends;
  torchao-int4-g128        on a CPU its prototype int4 layout
  spec-int8-k2, -k4, -k8   `ml.generate` with speculative decoding (chapter 10): the target's own weights
                           quantised to int8 draft k tokens a round; the draft's steps and the verify
                           pass compiled (mode "default"); timed end to end, like generate
  spec-bf16-k4             the same with the target's weights in bfloat16 as the draft
  spec-small-k4            an unrelated draft: a quarter of the width and of the layers, its own random
                           weights (acceptance near 0 with random weights: the cost of a useless draft)

A variant is a `Variant(impl, make)`: `make(model, hf, device)` returns a runner once per benchmark run,
and `runner.run(tokens, rows, new_tokens, warm)` generates `new_tokens` per row and returns `Timed`
(prefill and decode seconds, or the whole generation's only; the tokens; with `warm`, the wall time of
the first, compiling calls). Adding a variant (a quantised model, a speculative decoder, a
tensor-parallel one) is one runner class or function and one row of `TABLE`. Not here: the repeats,
the medians and the roofline figures (`runner.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..generate import decode_one_token, generate, prefill
from ..model import random_model
from ..quantize import quantize
from .timing import mark, spans, wall


class Timed(NamedTuple):
    prefill_s: float | None  # None: the variant times only the whole generation
    decode_s: float | None
    generate_s: float
    tokens: torch.Tensor  # [b, new_tokens]
    firsts: tuple[float, ...] = ()  # with warm: wall seconds of the first prefill and the first step


class Loop:
    """minillama's own loop: `prefill`, then `decode_one_token` per new token; int or tensor positions,
    optionally compiled (`compile_mode`: a torch.compile mode), the prefill too (`compile_prefill`)."""

    def __init__(
        self, model, device: torch.device, tensor_pos=True, compile_mode=None, compile_prefill=False
    ):
        self.model, self.device = model, device
        self.tensor_pos = tensor_pos
        self.compiled = compile_mode is not None
        self.cudagraphs = compile_mode == "reduce-overhead" and device.type == "cuda"
        step = decode_one_token
        self.step = torch.compile(step, mode=compile_mode, fullgraph=True) if self.compiled else step
        self.prefill = torch.compile(prefill, fullgraph=True, dynamic=False) if compile_prefill else prefill

    def run(self, tokens: torch.Tensor, rows, new_tokens: int, warm: bool = False) -> Timed:
        """Prefill `tokens` `[b, t]` and decode to `new_tokens` new tokens per row."""
        model, device = self.model, self.device
        b, t = tokens.shape
        lengths = torch.full((b,), t, device=device)
        pos = lengths.clone() if self.tensor_pos else t
        firsts = []
        marks = [mark(device)]
        if warm:
            seconds, (token, _) = wall(device, lambda: self.prefill(model, tokens, lengths))
            firsts.append(seconds)
        else:
            token, _ = self.prefill(model, tokens, lengths)
        marks.append(mark(device))
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
                seconds, (token, _) = wall(device, lambda token=token, pos=pos: self.step(model, token, pos))
                firsts.append(seconds)
            else:
                token, _ = self.step(model, token, pos)
            if self.cudagraphs:
                token = token.clone()  # the graph's output buffer is rewritten by the next replay
            out.append(token)
            pos += 1
        marks.append(mark(device))
        prefill_s, decode_s = spans(marks)
        return Timed(prefill_s, decode_s, prefill_s + decode_s, torch.cat(out, dim=1), tuple(firsts))


class PublicGenerate:
    """`ml.generate` end to end, timed as a whole."""

    compiled = False

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device

    def run(self, tokens, rows: list[list[int]], new_tokens: int, warm: bool = False) -> Timed:
        marks = [mark(self.device)]
        out = generate(self.model, rows, max_new_tokens=new_tokens, temperature=0.0)
        marks.append(mark(self.device))
        return Timed(None, None, spans(marks)[0], torch.tensor(out, device=self.device))


class Speculative:
    """`ml.generate` with a draft proposing `k` tokens a round (chapter 10), timed as a whole: the
    draft's one-token steps and the cached multi-position forwards compiled. `draft`: "int8" or
    "bf16" (the target's own weights, `speculative.self_draft`), or "small" (an unrelated smaller
    model). `stats` holds the last run's acceptance figures."""

    compiled = True

    def __init__(self, model, device: torch.device, draft: str, k: int):
        from .. import speculative as sp

        self.model, self.device, self.k = model, device, k
        if draft == "small":
            a = model.args
            small = a.replace(
                dim=a.dim // 4, n_layers=max(1, a.n_layers // 4), n_heads=max(1, a.n_heads // 4), n_kv_heads=1
            )
            self.draft = random_model(small, device, model.tok_embeddings.weight.dtype, seed=1)
        else:
            self.draft = sp.self_draft(model, draft)
        self.step = torch.compile(decode_one_token, fullgraph=True)
        self.verify = torch.compile(sp.verify, fullgraph=True, dynamic=False)
        self.stats = sp.SpeculativeStats()

    def run(self, tokens, rows: list[list[int]], new_tokens: int, warm: bool = False) -> Timed:
        from ..speculative import SpeculativeStats

        self.stats = SpeculativeStats()
        marks = [mark(self.device)]
        out = generate(
            self.model,
            rows,
            max_new_tokens=new_tokens,
            temperature=0.0,
            draft=self.draft,
            speculate_k=self.k,
            decode_step=self.step,
            verify_step=self.verify,
            stats=self.stats,
        )
        marks.append(mark(self.device))
        seconds = spans(marks)[0]
        return Timed(None, None, seconds, torch.tensor(out, device=self.device), (seconds,) if warm else ())


class _StepMarks:
    """A logits processor that only marks the time (a CUDA event on a GPU: no sync) each time
    `generate` has new logits: once after prefill, then once per decode step."""

    def __init__(self, device: torch.device):
        self.device, self.marks = device, []

    def __call__(self, input_ids, scores):
        self.marks.append(mark(self.device))
        return scores


class HFGenerate:
    """Hugging Face `generate` on the peer model; `cache`: None (its default, dynamic), "static", or
    "compile" (static + transformers' own torch.compile)."""

    compiled = False

    def __init__(self, hf, device: torch.device, cache: str | None = None):
        self.hf, self.device, self.cache = hf, device, cache

    def _kwargs(self) -> dict:
        from transformers import CompileConfig

        kwargs = {"do_sample": False}
        if self.cache == "static":
            kwargs.update(cache_implementation="static", disable_compile=True)
        elif self.cache == "compile":
            config = CompileConfig(fullgraph=False)
            if self.device.type != "cuda":  # transformers compiles on accelerators only unless told to
                config = CompileConfig(fullgraph=False, mode="default")
                config._compile_all_devices = True
            kwargs.update(cache_implementation="static", compile_config=config)
        return kwargs

    def run(self, tokens: torch.Tensor, rows, new_tokens: int, warm: bool = False) -> Timed:
        """Prefill is the start to the first logits (setup included), decode the first logits to the
        last, `new_tokens` - 1 steps, as minillama's."""
        from transformers import LogitsProcessorList

        kwargs, device = self._kwargs(), self.device
        steps = _StepMarks(device)
        start = mark(device)
        out = self.hf.generate(
            tokens,
            attention_mask=torch.ones_like(tokens),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            logits_processor=LogitsProcessorList([steps]),
            **kwargs,
        )
        end = mark(device)
        prefill_s, *decode = spans([start, steps.marks[0], steps.marks[-1], end])
        decode_s = decode[0] + decode[1]
        return Timed(prefill_s, decode_s, prefill_s + decode_s, out[:, tokens.shape[1] :])


def tensor_parallel(model, device: torch.device) -> Loop:
    """The `static` loop on a copy of `model` made tensor-parallel over all ranks of the process group."""
    import copy

    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        raise ValueError(
            "the tp variant needs several ranks: torchrun --nproc-per-node N -m minillama bench --variants static,tp"
        )
    from torch.distributed.device_mesh import init_device_mesh

    from ..distributed import parallelize

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return Loop(parallelize(copy.deepcopy(model), mesh), device)


class Variant(NamedTuple):
    impl: str  # "minillama" or "hf": which side of the comparison
    make: Callable  # (model, hf peer or None, device) -> a runner with .run(...) and .compiled
    quant: tuple | None = None  # (format, group_size, backend) of a quantised copy; None: the model as is
    extra_positions: int = 0  # cache positions beyond prompt + new tokens (a speculative round's k)


def _quantised(fmt: str, group_size: int | None, backend: str = "minillama", compile_mode=None) -> Variant:
    """A variant that runs the static loop on a quantised copy of the benchmark's model (its own cache)."""

    def make(model, hf, device):
        import copy

        shape = model.cache_shape
        q = quantize(copy.deepcopy(model), fmt, group_size=group_size, backend=backend)
        if shape is not None:
            q.setup_cache(*shape)
        return Loop(q, device, compile_mode=compile_mode)

    return Variant("minillama", make, (fmt, group_size, backend))


TABLE: dict[str, Variant] = {
    "eager": Variant("minillama", lambda m, hf, d: Loop(m, d, tensor_pos=False)),
    "static": Variant("minillama", lambda m, hf, d: Loop(m, d)),
    "compile": Variant("minillama", lambda m, hf, d: Loop(m, d, compile_mode="default")),
    "compile-reduce-overhead": Variant(
        "minillama", lambda m, hf, d: Loop(m, d, compile_mode="reduce-overhead")
    ),
    "compile-max-autotune": Variant("minillama", lambda m, hf, d: Loop(m, d, compile_mode="max-autotune")),
    "compile-prefill": Variant(
        "minillama", lambda m, hf, d: Loop(m, d, compile_mode="default", compile_prefill=True)
    ),
    "generate": Variant("minillama", lambda m, hf, d: PublicGenerate(m, d)),
    "hf": Variant("hf", lambda m, hf, d: HFGenerate(hf, d)),
    "hf-static": Variant("hf", lambda m, hf, d: HFGenerate(hf, d, cache="static")),
    "hf-compile": Variant("hf", lambda m, hf, d: HFGenerate(hf, d, cache="compile")),
    "tp": Variant("minillama", lambda m, hf, d: tensor_parallel(m, d)),
    "int8": _quantised("int8", None),
    "int8-compile": _quantised("int8", None, compile_mode="default"),
    **{f"int4-g{g}": _quantised("int4", g) for g in (32, 64, 128, 256)},
    "int4-g128-compile": _quantised("int4", 128, compile_mode="default"),
    "torchao-int8": _quantised("int8", None, "torchao", compile_mode="default"),
    "torchao-int4-g128": _quantised("int4", 128, "torchao", compile_mode="default"),
    **{
        f"spec-{draft}-k{k}": Variant(
            "minillama", lambda m, hf, d, draft=draft, k=k: Speculative(m, d, draft, k), extra_positions=k
        )
        for draft, k in [("int8", 2), ("int8", 4), ("int8", 8), ("bf16", 4), ("small", 4)]
    },
}
# weight-only quantised variants (chapter 9): not in the defaults, asked for by name
QUANTISED = tuple(v for v, variant in TABLE.items() if variant.quant is not None)
VARIANTS = tuple(TABLE)
ALIASES = {"compile-default": "compile"}
# the order the chapters' waterfall adds them in
WATERFALL = ("eager", "static", "compile", "compile-reduce-overhead")


def variant_list(variants) -> list[str]:
    """The variant names of a comma-separated string or a sequence, aliases resolved, each once."""
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
