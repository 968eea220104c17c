"""How the tiers' codes and the low-rank factors are chosen (build time only; not shipped).

``output_aware_codes`` is GPTQ's column-by-column rounding (Frantar et al. 2023; in float32 as their code, the
inverse Hessian's factor computed in float64) with the Hessian of a tied output layer, the covariance ``C = E[h hᵀ]``
of the hidden states it sees: each column's rounding error is pushed onto the columns not yet rounded so that
``E (h·(w − ŵ))²``, the expected logit error, stays small. Rows are independent, so each tier is rounded on its own
at its own width. Round-to-nearest is ``LowBitTensor.quantize``.
"""

from __future__ import annotations

import torch

from ...core.progress import progress
from ...runtime.lowbit import LowBitTensor, check_lowbit, group_params


def _inverse_hessian_factor(covariance: torch.Tensor, damping: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(C + λI)⁻¹`` (GPTQ's form of the inverse Hessian)."""
    hessian = covariance.double().clone()
    hessian.diagonal().add_(damping * float(hessian.diagonal().mean()))
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(hessian))
    return torch.linalg.cholesky(inverse, upper=True)


@torch.no_grad()
def output_aware_codes(
    weight: torch.Tensor, covariance: torch.Tensor, bits: int, group_size: int | None, damping: float = 0.01
) -> LowBitTensor:
    """``weight`` stored at ``bits`` with GPTQ rounding under ``covariance`` (``d×d``); group parameters are set
    from the error-updated columns when each group starts, as GPTQ does."""
    if bits == 16:
        return LowBitTensor.quantize(weight, 16)
    rows, columns = weight.shape
    group = check_lowbit(bits, group_size, columns)
    block = group if group <= 128 or group % 64 else 64  # a group always starts at a block start
    factor = _inverse_hessian_factor(covariance.to(weight.device), damping).float()
    work = weight.detach().float().clone()
    codes = torch.empty(rows, columns, dtype=torch.uint8, device=weight.device)
    scales, minima = [], []
    top = 2**bits - 1
    for start in progress(range(0, columns, block), desc=f"GPTQ int{bits} blocks", unit="block"):
        end = min(start + block, columns)
        if start % group == 0:
            scale, minimum = group_params(work[:, start : start + group], bits, group)
            scales.append(scale)
            minima.append(minimum)
        step, low = scales[-1].float()[:, 0], minima[-1].float()[:, 0]
        # the block's columns as contiguous rows: a column of the row-major matrix is strided, and reading it
        # column by column cost most of the rounding's time
        columns_now = work[:, start:end].T.contiguous()
        errors = torch.empty(end - start, rows, device=weight.device)
        block_codes = torch.empty(end - start, rows, dtype=torch.uint8, device=weight.device)
        diagonal = factor[start:end, start:end]
        for index in range(end - start):
            values = columns_now[index]
            code = torch.round((values - low) / step).clamp(0, top)
            block_codes[index] = code.to(torch.uint8)
            error = (values - (code * step + low)) / diagonal[index, index]
            columns_now[index:] -= diagonal[index, index:, None] * error[None]
            errors[index] = error
        codes[:, start:end] = block_codes.T
        work[:, end:].addmm_(errors.T, factor[start:end, end:], alpha=-1)  # in place: no rows × columns temporary
    stored = LowBitTensor(weight.shape, bits, group).to(weight.device)
    return stored.set_codes(codes, torch.cat(scales, dim=1), torch.cat(minima, dim=1))


@torch.no_grad()
def low_rank_factors(
    rows: torch.Tensor, rank: int, covariance: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(left, right)`` with ``left @ right`` the best rank-``rank`` approximation of ``rows``: in the output
    metric ``‖(w − ŵ) C^{1/2}‖`` with ``covariance`` (SVD of ``W C^{1/2}``, ``C^{-1/2}`` folded into ``right``),
    else in the plain Frobenius norm."""
    matrix = rows.detach().double()
    if rank > min(matrix.shape):
        raise ValueError(f"low_rank={rank} exceeds the {tuple(matrix.shape)} rows it approximates")
    if covariance is None:
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        return (u[:, :rank] * s[:rank]).float(), vh[:rank].float()
    values, vectors = torch.linalg.eigh(covariance.double().to(matrix.device))
    values = values.clamp(min=float(values.max()) * 1e-8)
    root, inverse_root = (vectors * values.sqrt()) @ vectors.T, (vectors / values.sqrt()) @ vectors.T
    u, s, vh = torch.linalg.svd(matrix @ root, full_matrices=False)
    return (u[:, :rank] * s[:rank]).float(), (vh[:rank] @ inverse_root).float()
