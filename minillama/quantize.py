"""Weight-only quantisation: int8 per output channel, int4 per group (chapter 9).

A batch-1 decode step reads every weight once and does two FLOPs with it (chapter 7), so its time is
the bytes of the weights over the memory bandwidth. Storing the weights in fewer bits cuts the bytes;
the activations, the KV cache and every sum stay in 16 or 32 bits, so the arithmetic is unchanged
and only the weights carry a rounding error.

- int8, symmetric, one scale per output channel (row): s = max|w_row| / 127, q = round(w / s) in
  -128..127, w ≈ q · s. The error of a weight is at most s / 2.
- int4, asymmetric, one scale and one zero per group of `group_size` inputs of a row: s = (max - min) / 15,
  q = round((w - min) / s) in 0..15, w ≈ (q - 8) · s + zero with zero = min + 8 · s (the value of the middle
  code). The error is at most s / 2 of its group. This is the layout of the "tinygemm" kernels that
  pytorch-labs/gpt-fast `quantize.py` (@ 1095a5c, `WeightOnlyInt4Linear`; its `WeightOnlyInt8Linear` is the
  int8 formula below) and torchao's int4 weight-only path call. Published speeds and perplexities on the
  real models: `minillama.sources` keys "gpt-fast-quant", "torchao-quant-llama3", "torchao-quant-llama31".

Kernels (PyTorch's own ops, no extension): on a CPU `aten._weight_int8pack_mm` (int8 codes times
16/32-bit activations, scaled per channel) and `aten._weight_int4pack_mm_for_cpu`; on CUDA
`aten._weight_int4pack_mm` (int4; int8 runs as dequantise-and-multiply, which torch.compile fuses into
one kernel). Every layer also has a pure-PyTorch path (`kernel=False`: dequantise, then `F.linear`) that
the tests compare the kernels against. The int4 kernels want their own packed copy of the codes, whose
layout differs between devices (and between AVX2 and AVX-512 CPUs), so a layer keeps the plain codes
(two per byte) for saving and derives the packed copy on the device it runs on.

`quantize(model, "int8")` / `quantize(model, "int4", group_size=128)` swaps every `nn.Linear` of the
blocks and, unless `head=False`, the output head, in place; the embedding and the norms stay 16-bit.
`backend="torchao"` hands the same job to torchao (pytorch/ao), imported only then.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

FORMATS = ("int8", "int4")
GROUP_SIZES = (32, 64, 128, 256)  # what the int4 kernels accept
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # weights and activations the kernels take


# ----------------------------------------------------------------------------------------------------------
# the formats, by hand


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` `[out, in]` -> int8 codes `[out, in]` and one scale per row `[out]` (in `w`'s dtype).
    The codes are rounded against the stored scale, so dequantising what is stored is within s / 2."""
    amax = w.float().abs().amax(dim=1)
    # a row of zeros gets the smallest normal scale (its codes are all 0), never a division by zero
    scales = (amax / 127).clamp_min(torch.finfo(w.dtype).tiny).to(w.dtype)
    codes = (w.float() / scales.float()[:, None]).round().clamp(-128, 127).to(torch.int8)
    return codes, scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 weights `[out, in]` from int8 codes and per-row scales."""
    return codes.float() * scales.float()[:, None]


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`w` `[out, in]` -> codes 0..15 `[out, in]` (uint8, one per byte), scales and zeros `[out, in / group_size]`
    (in `w`'s dtype), with w ≈ (q - 8) · scale + zero per group."""
    if w.dim() != 2 or group_size < 1 or w.shape[1] % group_size:
        raise ValueError(
            f"quantize_int4: groups of {group_size} do not split a weight of shape {tuple(w.shape)}: its "
            f"{w.shape[-1]} inputs are not a multiple of {group_size}; pass a 2-D [out, in] weight and a "
            "group_size that divides its inputs (one of 32, 64, 128, 256 that does, or keep this layer in bf16)"
        )
    groups = rearrange(w.float(), "o (n g) -> o n g", g=group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp_min(torch.finfo(w.dtype).tiny).to(w.dtype)
    zeros = (lo + 8 * scales.float()).to(w.dtype)
    # round against the stored scale and zero, so dequantising what is stored is within s / 2
    q = (groups - zeros.float()[..., None]) / scales.float()[..., None] + 8
    codes = q.round().clamp(0, 15).to(torch.uint8)
    return rearrange(codes, "o n g -> o (n g)"), scales, zeros


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """float32 weights `[out, in]` from codes 0..15 `[out, in]` and per-group scales and zeros `[out, n]`."""
    groups = rearrange(codes.float(), "o (n g) -> o n g", n=scales.shape[1])
    return rearrange((groups - 8) * scales.float()[..., None] + zeros.float()[..., None], "o n g -> o (n g)")


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte, `[out, in]` -> `[out, in / 2]` uint8: input 2j in the high nibble, 2j + 1 in the
    low one (the order `aten._convert_weight_to_int4pack` reads on CUDA)."""
    return (codes[:, 0::2] << 4) | codes[:, 1::2]


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: `[out, in / 2]` uint8 -> codes `[out, in]`."""
    return rearrange(torch.stack((packed >> 4, packed & 15), dim=-1), "o i two -> o (i two)")


# ----------------------------------------------------------------------------------------------------------
# the layers


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class Int8Linear(nn.Module):
    """y = x Wᵀ with W stored as int8 codes `weight` `[out, in]` and per-row `scales` `[out]`."""

    def __init__(self, in_features: int, out_features: int, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kernel = True  # False: the pure-PyTorch path
        self.register_buffer(
            "weight", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scales", torch.empty(out_features, dtype=dtype, device=device))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, dtype=w.dtype, device=w.device)
        layer.weight, layer.scales = quantize_int8(w)
        return layer

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8(self.weight, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel and x.device.type == "cpu" and x.dtype == self.scales.dtype:
            y = torch._weight_int8pack_mm(_flat(x), self.weight, self.scales)
            return y.reshape(*x.shape[:-1], self.out_features)
        # gpt-fast's formulation: widen the codes, multiply, scale the outputs; eager it materialises
        # a 16-bit copy of W every call, torch.compile fuses it (on a CPU, into _weight_int8pack_mm)
        return F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


class Int4Linear(nn.Module):
    """y = x Wᵀ with W stored as int4 codes, two per byte, `weight` `[out, in / 2]` uint8, and per-group
    `scales`, `zeros` `[out, in / group_size]`. `packed` and `scales_and_zeros` are the kernel's copy,
    derived on the device the layer runs on (not saved)."""

    def __init__(
        self, in_features: int, out_features: int, group_size: int, dtype=torch.bfloat16, device=None
    ):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.kernel = True
        n = in_features // group_size
        self.register_buffer(
            "weight", torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        )
        self.register_buffer("scales", torch.empty(out_features, n, dtype=dtype, device=device))
        self.register_buffer("zeros", torch.empty(out_features, n, dtype=dtype, device=device))
        self.register_buffer("packed", None, persistent=False)
        self.register_buffer("scales_and_zeros", None, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4Linear:
        w = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, group_size, dtype=w.dtype, device=w.device)
        codes, layer.scales, layer.zeros = quantize_int4(w, group_size)
        layer.weight = pack_int4(codes)
        layer.repack()
        return layer

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(unpack_int4(self.weight), self.scales, self.zeros)

    def repack(self) -> None:
        """Derive the kernel's copy of the codes for the device the layer is on (none where no kernel fits)."""
        self.packed = self.scales_and_zeros = None
        device, (n, k) = self.weight.device, (self.out_features, self.in_features)
        if device.type == "cpu" and n % 16 == 0:
            self.packed = torch._convert_weight_to_int4pack_for_cpu(
                unpack_int4(self.weight).to(torch.int32), 1
            )
        elif device.type == "cuda" and self.scales.dtype == torch.bfloat16 and n % 8 == 0:
            tiles = next((t for t in (8, 4, 2) if k % (16 * t) == 0), None)
            if tiles is not None:
                self.packed = torch._convert_weight_to_int4pack(self.weight, tiles)
        if self.packed is not None:
            # [out, n, 2] -> [n, out, 2]: the kernels read one (scale, zero) pair per group and output
            self.scales_and_zeros = rearrange(
                torch.stack((self.scales, self.zeros), dim=-1), "o n two -> n o two"
            )
            self.scales_and_zeros = self.scales_and_zeros.contiguous()

    def _apply(self, fn, recurse=True):
        # a move to another device needs that device's packing (the CPU and CUDA layouts differ)
        super()._apply(fn, recurse)
        if self.weight.device.type != "meta":
            self.repack()
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        if self.weight.device.type != "meta":
            self.repack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel and self.packed is not None and x.dtype == self.scales.dtype:
            mm = torch._weight_int4pack_mm_for_cpu if x.device.type == "cpu" else torch._weight_int4pack_mm
            y = mm(_flat(x), self.packed, self.group_size, self.scales_and_zeros)
            return y.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantize().to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group_size={self.group_size}"


# ----------------------------------------------------------------------------------------------------------
# the model


def _targets(model: nn.Module, head: bool) -> dict[str, nn.Linear]:
    """The linear layers to quantise: those of the blocks, and the output head when `head`."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and (name.startswith("layers.") or (head and name == "output"))
    }


def _check(model: nn.Module, format: str, group_size: int | None, head: bool, backend: str) -> dict:
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; use one of {FORMATS} (weight-only int8 or int4)")
    if backend not in ("minillama", "torchao"):
        raise ValueError(f"unknown backend {backend!r}; use 'minillama' (written here) or 'torchao'")
    if getattr(model, "quantization", None):
        raise ValueError(
            f"the model is already quantised ({model.quantization}); quantise a 16-bit model (ml.load it again)"
        )
    if format == "int8" and group_size is not None:
        raise ValueError("int8 has one scale per output channel: leave group_size out (it is for int4)")
    if format == "int4" and group_size not in GROUP_SIZES:
        raise ValueError(
            f"group_size={group_size} is not one the int4 kernels take; use one of {GROUP_SIZES}"
        )
    targets = _targets(model, head)
    for name, m in targets.items():
        if m.weight.dtype not in KERNEL_DTYPES:
            raise ValueError(
                f"{name} holds {m.weight.dtype} weights; the kernels take {[str(d) for d in KERNEL_DTYPES]}: "
                f"convert the model first (model.to(torch.bfloat16))"
            )
        if format == "int4" and m.in_features % group_size:
            fits = [g for g in GROUP_SIZES if m.in_features % g == 0]
            raise ValueError(
                f"group_size={group_size} does not divide the {m.in_features} inputs of {name}; "
                f"use one that does: {fits or 'none of ' + str(GROUP_SIZES) + ' (use int8)'}"
            )
    return targets


def _swap(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


def quantize(
    model: nn.Module,
    format: str = "int8",
    group_size: int | None = None,
    head: bool = True,
    backend: str = "minillama",
) -> nn.Module:
    """Quantise `model`'s weights in place (and return it): `format` "int8" (per output channel) or
    "int4" (per group of `group_size` inputs, default 128, one of 32, 64, 128, 256). `head=False` keeps the
    output head in 16 bits. `backend="torchao"` uses torchao's weight-only configs instead of this
    module's layers (int4 on a CPU: its prototype opaque layout). The model records the format in
    `model.quantization`, which `ml.save` writes into the config."""
    if format == "int4" and group_size is None:
        group_size = 128
    targets = _check(model, format, group_size, head, backend)  # everything checked before anything changes
    if backend == "torchao":
        _torchao(model, format, group_size, set(targets))
    else:
        for name, linear in targets.items():
            layer = (
                Int8Linear.from_linear(linear)
                if format == "int8"
                else Int4Linear.from_linear(linear, group_size)
            )
            _swap(model, name, layer)
    model.quantization = {"format": format, "group_size": group_size, "head": head, "backend": backend}
    # inference only: the codes have no gradient, and torch.compile would otherwise trace a backward
    return model.requires_grad_(False)


def quantized_like(model: nn.Module, spec: dict) -> nn.Module:
    """Swap `model`'s linear layers for empty quantised ones of `spec` (a `model.quantization` dict), e.g.
    on the meta device before loading a quantised checkpoint into it."""
    for name, linear in _targets(model, spec["head"]).items():
        w = linear.weight
        if spec["format"] == "int8":
            layer = Int8Linear(linear.in_features, linear.out_features, dtype=w.dtype, device=w.device)
        else:
            layer = Int4Linear(linear.in_features, linear.out_features, spec["group_size"], w.dtype, w.device)
        _swap(model, name, layer)
    model.quantization = dict(spec)
    return model.requires_grad_(False)


def use_kernels(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Route every quantised layer through the kernels (`True`) or the pure-PyTorch path (`False`)."""
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.kernel = enabled
    return model


def _torchao(model: nn.Module, format: str, group_size: int | None, names: set[str]) -> None:
    import logging

    # torchao's import warns about optional C++ extensions built for other torch builds (naming library
    # paths) and about enums torch now handles itself: nothing a user can act on
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        raise ValueError(
            "backend='torchao' needs torchao (pip install torchao==0.18.0); backend='minillama' needs nothing"
        ) from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    device = next(iter(model.parameters())).device
    # set_inductor_config=False: torchao would otherwise change torch.compile's global settings
    if format == "int8":
        config = Int8WeightOnlyConfig(set_inductor_config=False)
    elif device.type == "cpu":
        # torchao 0.18's stable Int4WeightOnlyConfig has no CPU layout ("plain" needs mslk, the tiled one
        # CUDA); its CPU int4 (the same _weight_int4pack_mm_for_cpu kernel) lives under prototype
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        config = PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)
    else:
        config = Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d",
                                      set_inductor_config=False)  # fmt: skip
    try:
        quantize_(model, config, filter_fn=lambda m, name: name in names)
    except (AssertionError, ImportError, NotImplementedError, RuntimeError) as error:
        raise ValueError(
            f"torchao cannot quantise to {format} on {device.type}: {error}; use backend='minillama'"
        ) from None
