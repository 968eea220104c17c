"""Simple token-embedding baselines at a given parameter budget, to compare ``method="tt"`` against.

Each writes its approximation back into the (tied) embedding matrix, dense, so input and output layer see exactly
what the compact form would give, and returns the parameters that compact form stores. Budgets count everything:
dense rows, factors and a shared fill row. The matrix SVD of the whole table is ``energy.apply_svd_embedding``.
"""

from __future__ import annotations

import torch
from torch import nn

from .calibration import output_basis


def rows_for_budget(hidden: int, params: int) -> int:
    """Dense rows that fit in ``params`` next to one shared fill row (``frequency_only``)."""
    return max(1, params // hidden - 1)


def tail_rank_for(vocab: int, hidden: int, rows: int, params: int) -> int:
    """The largest SVD rank ``k`` of the ``vocab − rows`` tail whose factors ``k(vocab − rows + hidden)`` fit in what
    ``rows`` dense rows leave of ``params``."""
    left = params - rows * hidden
    if left < vocab - rows + hidden:
        raise ValueError(f"{rows} dense rows of {hidden} leave {left} of {params} parameters: not even rank 1 fits")
    return left // (vocab - rows + hidden)


@torch.no_grad()
def frequency_only(model: nn.Module, kept: torch.Tensor) -> int:
    """Tokens ``kept`` keep their rows, every other row becomes their common mean (stored once); returns
    ``(len(kept) + 1)·d``. Tied: the dropped tokens share one logit."""
    weight = model.get_input_embeddings().weight
    dropped = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    dropped[kept.to(weight.device)] = False
    weight[dropped] = weight[dropped].mean(dim=0).to(weight.dtype)
    return (len(kept) + 1) * weight.shape[1]


@torch.no_grad()
def dense_rows_svd_tail(model: nn.Module, kept: torch.Tensor, rank: int, covariance: torch.Tensor | None = None) -> int:
    """Tokens ``kept`` keep their rows; the others (the tail) become the rank-``rank`` SVD of the tail rows. With
    ``covariance`` (of the hidden states entering a tied output layer) the SVD is taken of ``W C^{1/2}``, so it
    minimises the expected logit error like ``tt_basis="output"``; the factors absorb ``C^{-1/2}``, so nothing
    ``d×d`` is stored. Returns ``len(kept)·d + rank·(V − len(kept) + d)``."""
    weight = model.get_input_embeddings().weight
    vocab, hidden = weight.shape
    tail = torch.ones(vocab, dtype=torch.bool, device=weight.device)
    tail[kept.to(weight.device)] = False
    rows = weight[tail].double()
    if covariance is None:
        u, s, vh = torch.linalg.svd(rows, full_matrices=False)
        approx = (u[:, :rank] * s[:rank]) @ vh[:rank]
    else:
        basis = output_basis(weight, covariance).to(rows)  # P with P⁻¹ = C^{1/2} Q: rows of W P⁻¹ are whitened
        u, s, vh = torch.linalg.svd(rows @ torch.linalg.inv(basis), full_matrices=False)
        approx = (u[:, :rank] * s[:rank]) @ (vh[:rank] @ basis)
    weight[tail] = approx.to(weight.dtype)
    return int(len(kept)) * hidden + rank * (int(tail.sum()) + hidden)
