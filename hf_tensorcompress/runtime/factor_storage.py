"""Low-bit factors of the low-rank layers (CP, SVD): what they compute with while training, and how they are saved.

A layer with ``factor_bits`` trains fp32 factors but computes with them rounded exactly as ``LowBitTensor`` will
store them (straight-through gradients), saves only the codes (``save_codes``), and reads codes back into fp32
factors (``read_codes``: a kept best checkpoint, a Trainer resume). Loaded from a checkpoint, the layer holds the
``LowBitTensor`` codes themselves (its stored form). Rows are grouped along their columns: ``group_size`` where it
divides the row, else one group per row. The widths (``marker.FACTOR_WIDTHS``): 16 is bfloat16 values, 8 … 2
round-to-nearest codes with an fp16 scale and minimum per group, ``"ternary"`` BitNet b1.58's three levels per group,
five codes a byte with one fp16 level per group (``ternary.TernaryTensor``).

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch

from .lowbit import LowBitTensor, stored_values
from .marker import TERNARY
from .ternary import TernaryTensor, ternary_stored, ternary_values


def storage_spec(bits: int | str | None, group_size: int | None) -> dict:
    """The spec entries of a layer's factor storage (none for fp32 factors)."""
    return {} if bits is None else {"factor_bits": bits, "factor_group_size": group_size}


def storage_arguments(spec: dict) -> dict:
    """The constructor arguments of the layer a spec describes as a checkpoint holds it: with ``factor_bits``, the
    stored (inference-only) form."""
    bits = spec.get("factor_bits")
    return {"factor_bits": bits, "factor_group_size": spec.get("factor_group_size"), "stored": bits is not None}


def factor_group(group_size: int | None, columns: int) -> int | None:
    """The group size a factor row of ``columns`` uses: ``group_size`` where it divides the row, else the row."""
    return group_size if group_size is not None and columns % group_size == 0 else None


def stored_form(shape: tuple[int, int], bits: int | str, group_size: int | None) -> LowBitTensor | TernaryTensor:
    """An empty stored matrix of a factor of ``shape`` (what a checkpoint's codes load into)."""
    if bits == TERNARY:
        return TernaryTensor(shape, factor_group(group_size, shape[1]))
    return LowBitTensor(shape, bits, factor_group(group_size, shape[1]))


def stored(matrix: torch.Tensor, bits: int | str, group_size: int | None) -> LowBitTensor | TernaryTensor:
    """``matrix`` stored in ``bits`` (ternary: BitNet b1.58's codes at their least-squares level, ``ternary.py``;
    else round-to-nearest)."""
    group = factor_group(group_size, matrix.shape[1])
    if bits == TERNARY:
        return ternary_stored(matrix.detach(), group)
    return LowBitTensor.quantize(matrix.detach(), bits, group)


def rounded(matrix: torch.Tensor, bits: int | str, group_size: int | None) -> torch.Tensor:
    """The values ``matrix`` decodes to once stored; with gradients on, a straight-through estimate (``f + (r −
    f)``, which can differ from ``r`` in the last bit, so without gradients the stored values themselves)."""
    group = factor_group(group_size, matrix.shape[1])
    if bits == TERNARY:
        values = ternary_values(matrix, group, matrix.dtype)
    else:
        values = stored_values(matrix, bits, group, matrix.dtype)
    if not (torch.is_grad_enabled() and matrix.requires_grad):
        return values
    return matrix + (values - matrix).detach()


def fp16_rounded(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as fp16 stores it, in its own dtype, straight-through (an fp16 bias being trained)."""
    return tensor + (tensor.half().to(tensor.dtype) - tensor).detach()


def save_codes(
    state_dict: dict,
    prefix: str,
    factors: dict[str, tuple[str, torch.Tensor]],
    bits: int | str,
    group_size: int | None,
) -> None:
    """Replace each fp32 factor of ``state_dict`` by its codes: ``{stored name: (parameter name, matrix)}``."""
    for name, (parameter, matrix) in factors.items():
        for key, value in stored(matrix, bits, group_size).state_dict().items():
            state_dict[f"{prefix}{name}.{key}"] = value
        state_dict.pop(prefix + parameter, None)


def read_codes(
    state_dict: dict,
    prefix: str,
    name: str,
    shape: tuple[int, int],
    bits: int | str,
    group_size: int | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """The float values of the codes saved under ``name`` (their keys removed), or None if there are none."""
    if prefix + name + ".codes" not in state_dict:
        return None
    form = stored_form(shape, bits, group_size)
    form.load_state_dict({key: state_dict.pop(f"{prefix}{name}.{key}") for key in form.state_dict()})
    return form.dequantize(dtype)
