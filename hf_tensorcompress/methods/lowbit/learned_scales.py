"""Rounding against learned group scales: the ``weight_scales="learned"`` option of ``LowBitLinear``.

By default a low-bit weight is rounded against the scale its current values give (each group's range for integer
codes, the least-squares level for ternary), recomputed at every step. Learned, each group's scale (and, for integer
codes, its minimum) is a trained parameter instead: LSQ (Esser et al., 2020), with LSQ+'s learned offset for the
asymmetric codes (Bhalgat et al., 2020). The gradient reaches the scale through the rounding error and is scaled by
``1 / sqrt(group · top code)``, as LSQ prescribes; weights outside the clipped range get none. Storage is unchanged:
the codes, and the scale and minimum as fp16, are what ``LowBitTensor`` and ``TernaryTensor`` hold anyway, so a
trained layer saves, loads and exports as any other.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import math

import torch

from ...runtime.factor_storage import factor_group
from ...runtime.lowbit import LowBitTensor, check_lowbit, encode, group_params
from ...runtime.marker import TERNARY
from ...runtime.ternary import GROUP_CHECK_BITS, TernaryTensor, ternary_params

#: The range a learned scale is kept in: fp16's, where it is stored.
SMALLEST, LARGEST = torch.finfo(torch.float16).tiny, torch.finfo(torch.float16).max


def scale_groups(bits: int | str, group_size: int | None, columns: int) -> int:
    """Columns per scale group of a row of ``columns``: ``group_size`` where it divides the row, else the whole row
    (as storage groups them, ``factor_group``)."""
    return check_lowbit(GROUP_CHECK_BITS if bits == TERNARY else bits, factor_group(group_size, columns), columns)


def initial_scales(matrix: torch.Tensor, bits: int | str, group_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, minimum)``, fp32 ``(rows, groups)``: what rounding ``matrix`` now would use, where learning starts
    (ternary: its least-squares level, and a minimum of zeros that it never reads)."""
    group = scale_groups(bits, group_size, matrix.shape[1])
    if bits == TERNARY:
        scale = ternary_params(matrix, group)[1].float()
        return scale, torch.zeros_like(scale)
    scale, minimum = group_params(matrix, bits, group)
    return scale.float(), minimum.float()


def magnitude(scale: torch.Tensor) -> torch.Tensor:
    """The step a learned ``scale`` stands for: its magnitude, in fp16's range. A scale an update pushed past zero
    still has a gradient and can come back, where one clamped at the smallest step would be stuck there."""
    return scale.abs().clamp(SMALLEST, LARGEST)


def _as_stored(parameter: torch.Tensor, gradient_factor: float) -> torch.Tensor:
    """``parameter``'s fp16 value (as stored) in the forward pass, exactly; its gradient times ``gradient_factor``."""
    return parameter.detach().half().float() + (parameter - parameter.detach()) * gradient_factor


def learned_values(
    matrix: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int | str, group_size: int | None
) -> torch.Tensor:
    """``matrix`` rounded against the learned ``scale`` (and ``minimum``), as storing it would give. With gradients
    on: straight-through for the rounding, the scale's and minimum's gradients LSQ-scaled (the values may then
    differ from the stored ones in the last bit); without, the stored values themselves."""
    rows, columns = matrix.shape
    group = scale_groups(bits, group_size, columns)
    top = 1 if bits == TERNARY else 2**bits - 1
    factor = 1.0 / math.sqrt(group * top)
    grouped = matrix.view(rows, columns // group, group)
    step = _as_stored(magnitude(scale), factor)[..., None]
    low, offset = (-1, 0.0) if bits == TERNARY else (0, _as_stored(minimum, factor)[..., None])
    position = ((grouped - offset) / step).clamp(low, top)
    codes = torch.round(position.detach())
    if torch.is_grad_enabled() and any(t.requires_grad for t in (matrix, scale, minimum)):
        codes = position + (codes - position).detach()
    return (codes * step + offset).view(rows, columns)


def learned_stored(
    matrix: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int | str, group_size: int | None
) -> LowBitTensor | TernaryTensor:
    """``matrix`` stored against the learned ``scale`` (and ``minimum``): the codes ``learned_values`` rounds to,
    with the scale and minimum as fp16."""
    rows, columns = matrix.shape
    group = scale_groups(bits, group_size, columns)
    step = magnitude(scale.detach()).half()
    if bits == TERNARY:
        grouped = matrix.detach().float().view(rows, columns // group, group)
        codes = torch.round(grouped / step.float()[..., None]).clamp(-1, 1).add(1).to(torch.uint8)
        return TernaryTensor((rows, columns), group).to(matrix.device).set_codes(codes.view(rows, columns), step)
    offset = minimum.detach().half()
    stored = LowBitTensor((rows, columns), bits, group).to(matrix.device)
    return stored.set_codes(encode(matrix, step, offset, bits), step, offset)
