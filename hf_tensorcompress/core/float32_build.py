"""A calibrated build runs the model (calibration pass, the model's own text, the held-back check); on a CPU without
bf16 units (every AVX2 one and many AVX-512 ones) a bf16 model runs those passes in float32, and an fp16 model on
any CPU. There a bf16 forward is several times slower than fp32: SmolLM2-135M over 8,192 tokens took 154 s in bf16
against 32 s in fp32 on two AMD EPYC cores without them. A CPU with bf16 dot products (AVX512-BF16, AMX) runs bf16
faster than fp32 (SmolLM2 over 512 tokens on one AMD EPYC Zen 4 core: 1.2 s against 3.2 s), and the model builds in
its own dtype there, at half the fp32 bytes (``FLOAT32_BUILD`` or ``forced_float32`` cast it there too). Cast
weights are cast to float32 in place for the build (exactly: every bf16 and fp16 value is a float32 value) and back
after it, so the model keeps its dtypes and its config, and an error leaves it as it was. Build-time only (never
shipped in a checkpoint)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

#: The half-precision dtypes: a replacement layer takes the replaced module's.
HALF = (torch.bfloat16, torch.float16)

#: ``torch.cpu``'s checks for bf16 dot-product units.
BF16_UNITS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


def half_on_cpu(tensor: torch.Tensor) -> bool:
    return tensor.dtype in HALF and tensor.device.type == "cpu"


def native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product units (AVX512-BF16 or AMX), which run a bf16 forward faster than fp32."""
    return any(getattr(torch.cpu, check, lambda: False)() for check in BF16_UNITS)


#: Set to ``1`` (or ``true``, ``yes``, ``on``): a CPU build computes a bf16 model in float32 even where the CPU has
#: bf16 units (the comparison of the two, or a build that must not depend on the CPU it runs on).
FLOAT32_BUILD = "HF_TENSORCOMPRESS_FLOAT32_BUILD"


def float32_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes a CPU build computes in float32 instead: fp16, and bf16 where the CPU lacks bf16 units (or
    ``FLOAT32_BUILD`` is set)."""
    forced = os.environ.get(FLOAT32_BUILD, "").strip().lower() in ("1", "true", "yes", "on")
    return HALF if forced or not native_bf16() else (torch.float16,)


@contextlib.contextmanager
def forced_float32(enabled: bool = True) -> Iterator[None]:
    """Inside (with ``enabled``): every CPU build casts a bf16 model to float32 as on a CPU without bf16 units
    (``FLOAT32_BUILD`` set for the while; its value before is restored)."""
    before = os.environ.get(FLOAT32_BUILD)
    if enabled:
        os.environ[FLOAT32_BUILD] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FLOAT32_BUILD, None)
        else:
            os.environ[FLOAT32_BUILD] = before


def module_dtypes(model: nn.Module, names: list[str]) -> dict[str, torch.dtype]:
    """The half dtype of each of ``names`` whose own weights are half on CPU: what its replacement is cast to."""
    dtypes = {}
    for name in names:
        weights = [t for t in model.get_submodule(name).parameters(recurse=False) if t.is_floating_point()]
        if weights and half_on_cpu(weights[0]):
            dtypes[name] = weights[0].dtype
    return dtypes


@contextlib.contextmanager
def float32_on_cpu(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Inside: every parameter and buffer of ``model`` on CPU in one of ``float32_dtypes`` is float32 (a tied
    parameter stays one object). On exit, also by an exception, each is cast back to its dtype. Nothing changes with
    ``enabled=False``, on a float32 model, on a bf16 model where the CPU has bf16 units, or on a GPU."""
    if not enabled:
        yield
        return
    cast = float32_dtypes()

    def casts(tensor: torch.Tensor) -> bool:
        return tensor.dtype in cast and tensor.device.type == "cpu"

    # model.parameters() yields a tied parameter once
    parameters = [(p, p.dtype) for p in model.parameters() if casts(p)]
    buffers = [
        (module, key, buffer.dtype)
        for module in model.modules()
        for key, buffer in module.named_buffers(recurse=False)
        if casts(buffer)
    ]
    try:
        for parameter, _ in parameters:
            parameter.data = parameter.data.float()
        for module, key, _ in buffers:
            module._buffers[key] = module._buffers[key].float()
        yield
    finally:
        for parameter, dtype in parameters:
            parameter.data = parameter.data.to(dtype)
        for module, key, dtype in buffers:
            if module._buffers.get(key) is not None:
                module._buffers[key] = module._buffers[key].to(dtype)
