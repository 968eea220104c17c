"""A calibrated build runs the model (calibration pass, the model's own text, the held-back check); on CPU a bf16 or
fp16 model runs those passes in float32. CPUs without bf16 units (every AVX2 one and many AVX-512 ones) run a bf16
forward several times slower than fp32: SmolLM2-135M over 8,192 tokens took 154 s in bf16 against 32 s in fp32 on
the same two AMD EPYC cores. The half-precision weights are cast to float32 in place for the build (exactly: every bf16 and
fp16 value is a float32 value) and back after it, so the model keeps its dtypes and its config, and an error
leaves it as it was. Build-time only (never shipped in a checkpoint)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

#: The dtypes a CPU build computes in float32 instead.
HALF = (torch.bfloat16, torch.float16)


def half_on_cpu(tensor: torch.Tensor) -> bool:
    return tensor.dtype in HALF and tensor.device.type == "cpu"


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
    """Inside: every half-precision parameter and buffer of ``model`` on CPU is float32 (a tied parameter stays one
    object). On exit, also by an exception, each is cast back to its dtype. Nothing changes with ``enabled=False``,
    on a float32 model or on a GPU."""
    if not enabled:
        yield
        return
    # model.parameters() yields a tied parameter once
    parameters = [(p, p.dtype) for p in model.parameters() if half_on_cpu(p)]
    buffers = [
        (module, key, buffer.dtype)
        for module in model.modules()
        for key, buffer in module.named_buffers(recurse=False)
        if half_on_cpu(buffer)
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
