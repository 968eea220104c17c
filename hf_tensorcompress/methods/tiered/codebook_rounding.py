"""How a codebook tier's codebook and indices are chosen (build time only; not shipped).

Each row is divided by its RMS (its fp16 scale); the codebook is k-means (Lloyd, on a seeded subsample of the
scaled ``dim``-vectors) of those vectors. Indices are then either the nearest entry (``rounding="nearest"``) or
chosen GPTQ-style in blocks of ``dim`` columns (GPTVQ, van Baalen et al. 2024): each block is assigned in the metric
of the inverse-Hessian factor's diagonal block, and its error is pushed onto the columns not yet assigned, so that
the expected logit error ``E (h·(w − ŵ))²`` under the calibration covariance stays small.
"""

from __future__ import annotations

import torch

from ...core.progress import progress
from ...runtime.codebook import CodebookTensor
from .rounding import _inverse_hessian_factor

#: Most distances the nearest-entry search holds at once (1M floats, 4 MB): 65,536 entries against all the
#: vectors at once would take tens of GB, and a block that stays in cache is searched faster (2 cores, 1,024
#: entries: 4 MB 1.1 s, 8 MB 1.4 s, 64 MB about twice that).
BLOCK = 1 << 20

#: Entries whose least distance ``first_minimum`` takes in one vectorised pass before it looks for the index.
GROUP = 64

#: Columns whose errors are pushed on within the block before the rest of the row gets them in one product (GPTQ's
#: lazy batch update: the same result, without rewriting the whole row after every ``dim`` columns).
LAZY_COLUMNS = 128


def first_minimum(distances: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """``distances.argmin(1)``, the first index of each row's least value, about twice as fast on the CPU: torch's
    ``argmin`` over a row of 1,024 floats runs about 14× slower than its ``amin``, so each row's ``group``-wide
    minima are taken with ``amin``, and ``argmin`` runs only over those minima and inside the one group that holds
    the least (the first such group, then the first index in it: the index ``argmin`` gives, ties included)."""
    rows, entries = distances.shape
    if entries <= group or entries % group:
        return distances.argmin(1)
    grouped = distances.view(rows, entries // group, group)
    which = grouped.amin(2).argmin(1)
    return which * group + grouped[torch.arange(rows, device=distances.device), which].argmin(1)


def nearest(vectors: torch.Tensor, codebook: torch.Tensor, block: int = BLOCK, desc: str | None = None) -> torch.Tensor:
    """Index of each vector's nearest codebook entry (squared Euclidean distance), ``block // entries`` vectors at a
    time so memory stays bounded whatever the codebook size; with ``desc``, a progress bar over those blocks."""
    norms = (codebook * codebook).sum(1)
    rows = max(1, block // max(1, len(codebook)))
    indices = torch.empty(len(vectors), dtype=torch.int64)
    starts = range(0, len(vectors), rows)
    for start in progress(starts, desc=desc, unit="block") if desc else starts:
        part = vectors[start : start + rows]
        indices[start : start + rows] = first_minimum(torch.addmm(norms, part, codebook.T, alpha=-2))
    return indices


def kmeans(vectors: torch.Tensor, entries: int, iterations: int = 15, sample: int = 400_000) -> torch.Tensor:
    """Lloyd's k-means on a seeded subsample of ``vectors`` (``(n, dim)``); empty clusters re-seeded."""
    generator = torch.Generator().manual_seed(0)
    if len(vectors) > sample:
        vectors = vectors[torch.randperm(len(vectors), generator=generator)[:sample]]
    vectors = vectors.float()
    if len(vectors) < entries:
        vectors = vectors[torch.randint(len(vectors), (entries,), generator=generator)]
    centres = vectors[torch.randperm(len(vectors), generator=generator)[:entries]].clone()
    for _ in progress(range(iterations), desc=f"k-means ({entries} entries)", unit="iteration"):
        assigned = nearest(vectors, centres)
        sums = torch.zeros_like(centres).index_add_(0, assigned, vectors)
        counts = torch.zeros(entries).index_add_(0, assigned, torch.ones(len(vectors)))
        empty = counts == 0
        centres = torch.where(empty[:, None], centres, sums / counts.clamp(min=1)[:, None])
        if empty.any():
            centres[empty] = vectors[torch.randint(len(vectors), (int(empty.sum()),), generator=generator)]
    return centres


@torch.no_grad()
def codebook_codes(
    rows: torch.Tensor,
    dim: int,
    entries: int,
    covariance: torch.Tensor | None = None,
    damping: float = 0.01,
    codebook: torch.Tensor | None = None,
) -> CodebookTensor:
    """``rows`` stored as a ``CodebookTensor``: nearest entries, or GPTVQ under ``covariance`` when given; the
    codebook is k-means of ``rows`` unless given (fp16 values, ``(entries, dim)``)."""
    stored = CodebookTensor(rows.shape, dim, entries)
    rows = rows.detach().float().cpu()
    scale = rows.pow(2).mean(1).sqrt().clamp(min=1e-8).half().clamp(min=torch.finfo(torch.float16).tiny).float()
    vectors = (rows / scale[:, None]).reshape(-1, dim)
    codebook = (kmeans(vectors, entries) if codebook is None else codebook.cpu()).half().float()
    if covariance is None:
        indices = nearest(vectors, codebook, desc="codebook indices").reshape(len(rows), -1)
        return stored.set_indices(indices, scale, codebook)
    factor = _inverse_hessian_factor(covariance.cpu(), damping).float()
    work = rows.clone()
    indices = torch.empty(len(rows), rows.shape[1] // dim, dtype=torch.int64)
    lazy = max(dim, LAZY_COLUMNS // dim * dim)
    for outer in progress(range(0, rows.shape[1], lazy), desc="GPTVQ blocks", unit="block"):
        stop = min(outer + lazy, rows.shape[1])
        errors = torch.empty(len(rows), stop - outer)
        for start in range(outer, stop, dim):
            end = start + dim
            metric = torch.linalg.inv(factor[start:end, start:end])  # upper triangular
            chosen = nearest((work[:, start:end] / scale[:, None]) @ metric, codebook @ metric)
            indices[:, start // dim] = chosen
            error = (work[:, start:end] - codebook[chosen] * scale[:, None]) @ metric
            work[:, end:stop] -= error @ factor[start:end, end:stop]
            errors[:, start - outer : end - outer] = error
        work[:, stop:] -= errors @ factor[outer:stop, stop:]
    return stored.set_indices(indices, scale, codebook)
