"""Low-bit storage of a TT embedding: its trains, exact rows and basis held as ``LowBitTensor`` codes.

Ships inside saved checkpoints: torch only. All cores of a token form one row of ``P = Σ_k R_{k-1} I_k R_k`` codes
(one ``(V, P)`` ``LowBitTensor``): one scale and minimum per token (or per ``group_size`` values where that divides
``P``) instead of one per core, and no per-core padding to whole bytes. Before rounding, every token's cores are
rescaled to the same largest entry (a train is unchanged when one core is multiplied by ``α`` and another by
``1/α``), so a shared scale does not starve the cores with small entries. Rows are independent, so tokens are
added, replaced or removed by their rows of codes. Exact rows and the basis are ``(n, d)`` / ``(d, d)`` matrices
grouped along ``d``.
"""

from __future__ import annotations

import torch

from ...runtime.factor_storage import factor_group
from ...runtime.lowbit import LowBitTensor
from ...runtime.marker import FACTOR_BITS


def check_storage_bits(bits: object) -> None:
    """A clear error for a width a TT layer cannot store (the config checks it too, before any model is seen)."""
    if isinstance(bits, bool) or bits not in FACTOR_BITS:
        raise ValueError(f"tt_storage_bits={bits!r}: choose one of {list(FACTOR_BITS)}, or None for float storage")


def check_code_storage(bits: int, group_size: int | None, hidden: int) -> None:
    """A clear error for a width or group size a TT layer cannot store."""
    check_storage_bits(bits)
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or hidden % group_size
    ):
        raise ValueError(
            f"tt_storage_group_size={group_size!r} must be an int >= 1 dividing the hidden size {hidden} (exact rows "
            "and the basis are grouped along it), or None for one group per row"
        )


def core_sizes(shape: list[int], ranks: list[int]) -> list[int]:
    """Values per token of each core at the stored ranks: ``R_{k-1}·I_k·R_k``."""
    bounds = [1, *ranks, 1]
    return [bounds[k] * shape[k] * bounds[k + 1] for k in range(len(shape))]


def trains_form(vocab: int, shape: list[int], ranks: list[int], bits: int, group_size: int | None) -> LowBitTensor:
    """An empty ``(V, P)`` ``LowBitTensor`` of a vocabulary's trains (what a checkpoint's codes load into)."""
    width = sum(core_sizes(shape, ranks))
    return LowBitTensor((vocab, width), bits, factor_group(group_size, width))


def matrix_form(rows: int, columns: int, bits: int, group_size: int | None) -> LowBitTensor:
    """An empty ``LowBitTensor`` of exact rows or the basis, grouped along ``d``."""
    return LowBitTensor((rows, columns), bits, group_size)


def train_rows(cores: list[torch.Tensor]) -> torch.Tensor:
    """``(n, P)`` rows of the trains ``cores`` (``(n, R_{k-1}, I_k, R_k)`` each), every token's cores rescaled
    to the same largest entry (their product, the token's vector, is unchanged)."""
    flat = [core.detach().double().reshape(core.shape[0], -1) for core in cores]
    peaks = torch.stack([part.abs().amax(dim=1) for part in flat], dim=1)  # (n, N)
    alive = (peaks > 0).all(dim=1, keepdim=True)
    logs = peaks.clamp(min=torch.finfo(torch.float64).tiny).log()
    factors = torch.where(alive, (logs.mean(dim=1, keepdim=True) - logs).exp(), torch.ones_like(peaks))
    return torch.cat([part * factors[:, k, None] for k, part in enumerate(flat)], dim=1).to(cores[0].dtype)


def unpack_rows(rows: torch.Tensor, shape: list[int], ranks: list[int]) -> list[torch.Tensor]:
    """Inverse of ``train_rows`` (up to the rescaling): ``(n, P)`` rows → cores ``(n, R_{k-1}, I_k, R_k)``."""
    bounds, sizes = [1, *ranks, 1], core_sizes(shape, ranks)
    parts = rows.split(sizes, dim=1)
    return [part.reshape(len(rows), bounds[k], shape[k], bounds[k + 1]) for k, part in enumerate(parts)]


def stored_trains(cores: list[torch.Tensor], bits: int, group_size: int | None) -> LowBitTensor:
    """The trains ``cores`` rounded to ``bits`` as one ``(V, P)`` ``LowBitTensor``."""
    rows = train_rows(cores)
    return LowBitTensor.quantize(rows, bits, factor_group(group_size, rows.shape[1]))


def stored_matrix(matrix: torch.Tensor, bits: int, group_size: int | None) -> LowBitTensor:
    """Exact rows or the basis rounded to ``bits``, grouped along ``d``."""
    return LowBitTensor.quantize(matrix.detach(), bits, group_size)
