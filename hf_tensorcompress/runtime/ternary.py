"""Ternary storage of a matrix: BitNet b1.58's rounding per group, held in the 2-bit ``LowBitTensor`` format.

Each group of ``group_size`` consecutive columns of a row gets the absmean scale ``s = mean|x|`` (rounded to fp16) and
its values become ``s · clamp(round(x / s), -1, 1)``. Stored as codes ``{0, 1, 2}`` with scale ``s`` and minimum
``-s``, ``code · scale + minimum`` decodes to exactly ``{-s, 0, +s}``, so a ternary factor loads (natively and through
``trust_remote_code``) with the 2-bit decoder; only the rounding differs from round-to-nearest over the range.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch

from .lowbit import LowBitTensor, check_lowbit

#: The packed width ternary codes are stored in.
TERNARY_STORAGE_BITS = 2


def ternary_params(tensor: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group ``(scale, minimum)`` = ``(s, -s)`` (fp16, ``(rows, groups)``), ``s`` the absmean of the group."""
    rows, columns = tensor.shape
    grouped = tensor.detach().float().reshape(rows, columns // group_size, group_size)
    high = torch.finfo(torch.float16).max
    scale = grouped.abs().mean(dim=-1).clamp(1e-8, high).half().clamp(min=torch.finfo(torch.float16).tiny)
    return scale, -scale


def ternary_codes(tensor: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Codes ``clamp(round(x / s), -1, 1) + 1`` (uint8, unpacked) of ``tensor`` against per-group ``scale``."""
    rows, columns = tensor.shape
    grouped = tensor.detach().float().reshape(rows, scale.shape[1], -1)
    levels = torch.round(grouped / scale.float()[..., None]).clamp(-1, 1)
    return (levels + 1).to(torch.uint8).reshape(rows, columns)


def ternary_values(tensor: torch.Tensor, group_size: int | None, dtype: torch.dtype) -> torch.Tensor:
    """What ``ternary_stored(tensor, group_size).dequantize(dtype)`` returns, bit for bit, without packing codes:
    quantization-aware training calls this on every ternary factor at every step."""
    rows, columns = tensor.shape
    group = check_lowbit(TERNARY_STORAGE_BITS, group_size, columns)
    scale, minimum = ternary_params(tensor, group)
    values = ternary_codes(tensor, scale).to(dtype).view(rows, columns // group, group)
    return values.mul_(scale.to(dtype)[..., None]).add_(minimum.to(dtype)[..., None]).view(rows, columns)


def ternary_stored(tensor: torch.Tensor, group_size: int | None) -> LowBitTensor:
    """``tensor`` rounded to three levels per group, as a 2-bit ``LowBitTensor``."""
    if tensor.dim() != 2:
        raise ValueError(f"ternary storage takes matrices; got shape {tuple(tensor.shape)}")
    stored = LowBitTensor(tensor.shape, TERNARY_STORAGE_BITS, group_size).to(tensor.device)
    scale, minimum = ternary_params(tensor, stored.group_size)
    return stored.set_codes(ternary_codes(tensor, scale), scale, minimum)
