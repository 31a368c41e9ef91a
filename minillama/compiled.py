"""The compiled decode step (chapter 8): one model's single-token forward, compiled once by
`torch.compile` with the Inductor settings that make a CPU matrix-vector product run near the memory
bus, and kept with the model so that every later `generate` reuses it.

A batch-1 decode step multiplies every weight matrix by one vector: its time is the bytes of the
weights over the bandwidth the kernel reaches. PyTorch's default CPU kernel for that product (MKL's
GEMV, behind `F.linear`) reads a large fp32 matrix well below a plain copy's bandwidth. On a CPU
`compile_decode` therefore asks Inductor (`torch._inductor.config`, see `CPU_OPTIONS`) for

- `max_autotune` with `max_autotune_gemm_backends="CPP,ATEN"`: each matrix product is timed once at
  compile time as Inductor's C++ GEMM template (a generated, register-blocked kernel) and as ATen's
  call, and the faster one is kept (`CPU_OPTIONS`, for int8 and int4 weights); for float32 weights the
  template alone (`CPU_FLOAT32_OPTIONS`), and for bfloat16 weights no timing and ATen's oneDNN linear
  alone (`CPU_BF16_OPTIONS`): why, beside each;
- `cpp_wrapper`: the code that calls the step's kernels one after another is generated as C++, not
  Python, which takes the interpreter's work per kernel call out of every step;
- `freezing`: the weights become constants of the compiled graph, so the template can repack each
  one, once, into the blocked layout its kernel streams through (the model's own tensors stay as they
  are; the packed copies take as much memory again);

and compiles the step with `fullgraph=True, dynamic=False`: the position is a tensor (`decode.py`),
so nothing recompiles as positions advance; a new batch size or cache length compiles once more.
Sampling stays outside the compiled graph, so a seeded `torch.Generator` works as in eager decoding.

The settings apply to this step only: they are patched into `torch._inductor.config` around each call
of the step (`torch._inductor.config.patch`, restored on return), so the user's global configuration is
never changed. (`torch.compile(..., options=...)` would be the obvious way, but in torch 2.13 it leaves
`freezing` off, and without frozen weights the template is not used: chapter 8 shows the difference.) Because the weights are frozen into the compiled step, a
step is cached per model together with a fingerprint of its weights (the tensors' identities and
version counters); a model whose weights were replaced or changed in place (`ml.quantize`,
`load_state_dict`, an in-place edit) gets a fresh compilation instead of stale constants.

    step = ml.compile_decode(model)                  # cached on the model; compiles on first call
    out = ml.generate(model, [ids], compile=True)    # the same step, via generate
    step.compile_s                                   # seconds spent compiling, so far
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from .model import Transformer
from .sampling import sample

__all__ = [
    "CPU_BF16_OPTIONS",
    "CPU_FLOAT32_OPTIONS",
    "CPU_OPTIONS",
    "CompiledDecode",
    "compile_decode",
    "options_for",
]

# the settings of issue 24's first measurement (the 49,152 x 576 head at about 3x MKL's GEMV bandwidth);
# benchmarks/compile_cpu.py measures them on SmolLM2-135M against eager, the defaults and "CPP" alone
CPU_OPTIONS: dict = {
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    "freezing": True,
    # the step's wrapper (the code that allocates buffers and calls each kernel in turn, hundreds of calls
    # per step) generated as C++ instead of Python: by the medians of paired rounds on an AVX-512 Xeon the
    # Python wrapper's step took 1.002x (fp16) to 1.11x (bf16) as long, never less, in every format
    # (benchmarks/results/intel-xeon-avx512/compile-cpu.json, the "-python" variants), at the price of
    # 11-25 s more compile time
    "cpp_wrapper": True,
}
# float32 weights: the template alone. With ATen among the candidates, freezing first rewrites every
# float32 linear to MKL's packed GEMM (`mkl._mkl_linear`), and autotuning keeps MKL for the large
# matrices although, streamed from DRAM as a decode step reads them, the template reads the
# 49,152 x 576 head at about 1.6x MKL's bandwidth, and the whole fp32 step in half the time, on the AMD
# EPYC of benchmarks/results/compile-cpu.json
CPU_FLOAT32_OPTIONS: dict = {**CPU_OPTIONS, "max_autotune_gemm_backends": "CPP"}
# bfloat16 weights: frozen, no timing. Freezing packs each bf16 linear for oneDNN; the template's bf16
# micro-kernel reads the 576-wide matrices of SmolLM2-135M's blocks slower, yet wins the compile-time
# timing for them (likely because each matrix is timed on its own, in cache), so "CPP,ATEN" made the slower
# step by the medians and in 4 of 5 paired rounds, though not in all of them, and compiled in about twice
# the time (benchmarks/compile_cpu.py's bf16 "cpp" and "frozen" rows; chapter 8 prints the rounds), all
# on an AVX-512 CPU. On an AVX2-only CPU oneDNN has no bf16 kernel and freezing leaves each linear to ATen's
# matmul; whether "CPP,ATEN" does better there is not yet measured
CPU_BF16_OPTIONS: dict = {"freezing": True, "cpp_wrapper": True}
# float16 weights take CPU_OPTIONS: the template's micro-kernel (fp16 read, fp32 accumulate) wins the timing for
# every matrix, and SmolLM2-135M's fp16 step ran at 0.85x llama.cpp's F16 (bfloat16 frozen: 0.77x) with
# llama.cpp's greedy tokens, on an AVX-512 Xeon (benchmarks/llamacpp/intel-xeon-avx512/*-2026-12-04-fp16.json);
# with cpp_wrapper 0.92x (*-2026-12-04-cpp-wrapper.json)
# on an accelerator Inductor's default (Triton kernels, no autotuning) is the step chapter 8 measures
ACCELERATOR_OPTIONS: dict = {}

_ATTR = "_minillama_compiled"  # where a model keeps its compiled steps


class _Steps(dict):
    """A model's compiled steps: a copy or a pickle of the model starts without them (a compiled step
    belongs to the one model whose weights it froze)."""

    def __deepcopy__(self, memo):
        return _Steps()

    def __reduce__(self):
        return (_Steps, ())


def options_for(
    device: torch.device | str, dtype: torch.dtype | None = None, quantized: bool = False
) -> dict:
    """The Inductor options `compile_decode` uses by default on `device` for a model whose floating
    weights are `dtype` and whose matrices are int8 or int4 if `quantized` (a copy: change it freely):
    on a CPU `CPU_OPTIONS` for a quantised model, `CPU_FLOAT32_OPTIONS` for float32, `CPU_BF16_OPTIONS`
    for bfloat16 and `CPU_OPTIONS` otherwise; on an accelerator `ACCELERATOR_OPTIONS`."""
    if torch.device(device).type != "cpu":
        return dict(ACCELERATOR_OPTIONS)
    if quantized:
        return dict(CPU_OPTIONS)
    if dtype == torch.float32:
        return dict(CPU_FLOAT32_OPTIONS)
    return dict(CPU_BF16_OPTIONS if dtype == torch.bfloat16 else CPU_OPTIONS)


def _default_options(model: Transformer) -> dict:
    """`options_for` the model's device, the dtype of its embedding (which `ml.quantize` leaves
    floating: the bf16 of an int8 or int4 model) and whether `ml.quantize` changed it."""
    weight = model.tok_embeddings.weight
    return options_for(weight.device, weight.dtype, quantized=bool(getattr(model, "quantization", None)))


def _fingerprint(model: Transformer) -> tuple:
    """Which tensors the model's weights are, and how often each was changed in place (the KV cache,
    state of a generation, is left out)."""
    items = []
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if ".cache." in name or t is None:
            continue
        try:
            version = t._version
        except RuntimeError:  # an inference tensor keeps no version counter
            version = None
        items.append((name, id(t), t.data_ptr(), version, t.dtype, t.device))
    return tuple(items), repr(getattr(model, "quantization", None))


class CompiledDecode:
    """A decode step compiled for one model, called as `generate`'s `decode_step`:
    `step(model, token [b, 1], pos [b], **sampling) -> (next tokens [b, 1], logits [b, v])`.

    `compile_s`: seconds spent in calls that compiled (the first call, and the first call of each new
    batch size or cache length); `compiles`: how many such calls there were; `options`: the Inductor
    options it was compiled with."""

    _made = 0

    def __init__(self, model: Transformer, options: Mapping | None = None):
        if not isinstance(model, Transformer):
            raise ValueError(f"compile_decode takes a minillama Transformer; got {type(model).__name__}")
        self.model = model
        self.options = dict(_default_options(model) if options is None else options)
        self.fingerprint = _fingerprint(model)
        self.compile_s = 0.0
        self.compiles = 0
        self._seen: set[tuple] = set()

        def forward(token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            return model(token, start_pos=pos)[:, 0]

        # Dynamo keeps its compiled graphs on the function's code object, shared by every closure made
        # from it: a code object of its own per step keeps one step's graphs (and frozen weights) from
        # ever serving another model, or this model after its weights changed
        CompiledDecode._made += 1
        forward.__code__ = forward.__code__.replace(co_name=f"compiled_decode_{CompiledDecode._made}")
        self._forward = torch.compile(forward, fullgraph=True, dynamic=False)

    def _settings(self):
        """The options as a scoped `torch._inductor.config.patch` (restored on exit)."""
        import torch._inductor.config

        return torch._inductor.config.patch(self.options)

    def _signature(self, token: torch.Tensor, pos: torch.Tensor) -> tuple:
        return tuple(token.shape), tuple(pos.shape), token.dtype, self.model.cache_shape

    def logits(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The compiled forward alone: `token` `[b, 1]` at positions `pos` `[b]` -> float32 logits `[b, v]`."""
        if not isinstance(pos, torch.Tensor):
            raise ValueError(
                f"pos must be a tensor (got {type(pos).__name__}): an int would compile once per position"
            )
        signature = self._signature(token, pos)
        # the options are patched in around every call, since any call may compile (the first, or after
        # a guard fails), and `torch.compile(options=...)` would not do: in torch 2.13 it leaves
        # `freezing` off, because compile_fx reads that setting outside the options' scope.
        # inference_mode: one grad mode for every call (a change would recompile), and freezing needs
        # gradients off
        start = time.perf_counter()
        with self._settings(), torch.inference_mode():
            out = self._forward(token, pos)
        if signature not in self._seen:  # this call compiled
            self.compile_s += time.perf_counter() - start
            self.compiles += 1
            self._seen.add(signature)
        return out

    def __call__(self, model: Transformer, token: torch.Tensor, pos: torch.Tensor, **sampling):
        if model is not self.model:
            raise ValueError(
                "this compiled step belongs to another model (its weights are frozen into it); "
                "use ml.compile_decode(model) for this one"
            )
        logits = self.logits(token, pos)
        return sample(logits, **sampling)[:, None], logits

    def __repr__(self) -> str:
        return (
            f"CompiledDecode(options={self.options}, compiles={self.compiles}, "
            f"compile_s={self.compile_s:.1f})"
        )


def compile_decode(model: Transformer, options: Mapping | None = None) -> CompiledDecode:
    """The compiled decode step of `model`, built on first use and cached on the model.

    `options`: Inductor options for this compilation only (default `options_for(device, dtype)`: on a
    CPU, frozen weights, with the C++ GEMM template: `CPU_FLOAT32_OPTIONS`, `CPU_BF16_OPTIONS` or `CPU_OPTIONS`). The same model and options return the
    same step, so a second `generate(..., compile=True)` does not compile again, unless the model's
    weights changed since (then the step is compiled afresh). Compilation itself happens at the
    step's first call (`step.compile_s` says how long it took)."""
    if not isinstance(model, Transformer):
        raise ValueError(f"compile_decode takes a minillama Transformer; got {type(model).__name__}")
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(
            f"options must be a dict of torch._inductor.config settings (or None); got {type(options).__name__}"
        )
    resolved = dict(_default_options(model) if options is None else options)
    key = repr(sorted(resolved.items()))
    steps = model.__dict__.setdefault(_ATTR, _Steps())
    step = steps.get(key)
    if step is None or step.fingerprint != _fingerprint(model):
        step = steps[key] = CompiledDecode(model, resolved)
    return step
