"""Ternary storage of a matrix: BitNet b1.58's three levels per group, held in the 2-bit ``LowBitTensor`` format.

Each group of ``group_size`` consecutive columns of a row takes BitNet b1.58's codes ``clamp(round(x / m), -1, 1)``
against its absmean ``m = mean|x|``; its level ``s`` is then the mean ``|x|`` of the entries with a non-zero code
(rounded to fp16), the least-squares level for those codes. That level also makes the rounding idempotent: rounding
values that are already ``{-s, 0, +s}`` gives them back, so a kept best checkpoint or a resumed run (which reload the
decoded values as fp32 factors) computes exactly what was validated, where absmean levels would shrink every time.
Stored as codes ``{0, 1, 2}`` with scale ``s`` and minimum ``-s``, ``code · scale + minimum`` decodes to exactly
``{-s, 0, +s}``, so a ternary factor loads (natively and through ``trust_remote_code``) with the 2-bit decoder; only
the rounding differs from round-to-nearest over the range.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch

from .lowbit import LowBitTensor, check_lowbit

#: The packed width ternary codes are stored in.
TERNARY_STORAGE_BITS = 2


def ternary_params(tensor: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(codes, scale, minimum)``: codes ``{0, 1, 2}`` (uint8, unpacked, ``tensor``'s shape) and per-group ``(s,
    -s)`` (fp16, ``(rows, groups)``), ``s`` the mean ``|x|`` of the group's non-zero codes."""
    rows, columns = tensor.shape
    grouped = tensor.detach().float().reshape(rows, columns // group_size, group_size)
    magnitude = grouped.abs()
    absmean = magnitude.mean(dim=-1, keepdim=True).clamp(min=1e-8)
    levels = torch.round(grouped / absmean).clamp(-1, 1)
    nonzero = levels != 0
    level = (magnitude * nonzero).sum(-1) / nonzero.sum(-1).clamp(min=1)
    high = torch.finfo(torch.float16).max
    scale = level.clamp(1e-8, high).half().clamp(min=torch.finfo(torch.float16).tiny)
    return (levels + 1).to(torch.uint8).reshape(rows, columns), scale, -scale


def ternary_values(tensor: torch.Tensor, group_size: int | None, dtype: torch.dtype) -> torch.Tensor:
    """What ``ternary_stored(tensor, group_size).dequantize(dtype)`` returns, bit for bit, without packing codes:
    quantization-aware training calls this on every ternary factor at every step."""
    rows, columns = tensor.shape
    group = check_lowbit(TERNARY_STORAGE_BITS, group_size, columns)
    codes, scale, minimum = ternary_params(tensor, group)
    values = codes.to(dtype).view(rows, columns // group, group)
    return values.mul_(scale.to(dtype)[..., None]).add_(minimum.to(dtype)[..., None]).view(rows, columns)


def ternary_stored(tensor: torch.Tensor, group_size: int | None) -> LowBitTensor:
    """``tensor`` rounded to three levels per group, as a 2-bit ``LowBitTensor``."""
    if tensor.dim() != 2:
        raise ValueError(f"ternary storage takes matrices; got shape {tuple(tensor.shape)}")
    stored = LowBitTensor(tensor.shape, TERNARY_STORAGE_BITS, group_size).to(tensor.device)
    return stored.set_codes(*ternary_params(tensor, stored.group_size))
