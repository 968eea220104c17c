"""The TT-SVD of an embedding table, one tensor train per row, and the rebuild of rows from their trains.

Ships inside saved checkpoints: torch only. The vocabulary axis is never factorized: each row is decomposed on its
own (batched over blocks of rows, spread over threads), so tokens can be compressed, added or replaced one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from .choices import TT_SOLVERS


def balanced_shape(size: int, order: int) -> list[int]:
    """The ``order`` factors (ascending) of ``size`` closest to each other (smallest max/min spread)."""
    if order < 1 or size < 1:
        raise ValueError(f"need size >= 1 and order >= 1, got size={size}, order={order}")
    best: list[int] | None = None

    def search(rest: int, smallest: int, slots: int, prefix: list[int]) -> None:
        nonlocal best
        if slots == 1:
            if rest >= smallest:
                candidate = prefix + [rest]
                if best is None or (candidate[-1] - candidate[0], candidate[-1]) < (best[-1] - best[0], best[-1]):
                    best = candidate
            return
        factor = smallest
        while factor**slots <= rest:
            if rest % factor == 0:
                search(rest // factor, factor, slots - 1, prefix + [factor])
            factor += 1

    search(size, 2 if order > 1 else 1, order, [])
    if best is None:
        raise ValueError(
            f"{size} cannot be split into {order} factors >= 2; use a smaller tt_order (at most "
            f"{sum(1 for _ in _prime_factors(size))}) or give tt_shape explicitly"
        )
    return best


def _prime_factors(size: int):
    factor = 2
    while factor * factor <= size:
        while size % factor == 0:
            yield factor
            size //= factor
        factor += 1
    if size > 1:
        yield size


#: TT-SVD solvers for the dominant subspaces: ``"eigh"`` (exact, LAPACK), ``"power"`` (fixed ranks only) and
#: ``"auto"`` (``resolve_solver``: power for fixed ranks, eigh for the ε mode).

#: ``"power"`` raises each Gram matrix to the power ``2**POWER_SQUARINGS`` by repeated squaring. 8 leaves the
#: reconstruction error of SmolLM2's embedding at 1.006× the exact TT-SVD's (8×8×9, ranks 5,5); 16 squares the
#: conditioning past what one Cholesky QR in float64 survives (benchmarks/tt_embedding.py).
POWER_SQUARINGS = 3

#: Rows decomposed together: blocks keep every intermediate a few MB (whole-vocabulary ones are fresh 20-70 MB
#: allocations per product) and are spread over ``torch.get_num_threads()`` threads. Fixed, so results do not
#: depend on the number of threads.
DECOMPOSE_BLOCK = 4096

#: Rows per block on an accelerator, one block at a time: large batches keep a GPU busy, and the block's
#: intermediates (a few times its rows) stay far below the table, so peak memory is table + cores + one block.
DEVICE_BLOCK = 65536

#: Seconds a decomposition runs before its progress bar appears (SmolLM2's 28M entries decompose in seconds and
#: print nothing; an 8B model's 128k × 4096 = 537M take minutes on a CPU).
PROGRESS_DELAY = 2.0


def resolve_solver(solver: str, max_ranks: list[int] | None, eps) -> str:
    """``"auto"`` → ``"power"`` for fixed ranks (no ``eps``), ``"eigh"`` for the ε mode, which needs every
    singular value. Power iteration was 2-3× faster than ``eigh`` on SmolLM2's vocabulary with an error of
    1.006× the exact TT-SVD's (bar: 1.01×, benchmarks/tt_embedding.py); tokens where it cannot be trusted fall
    back to ``eigh`` inside ``_dominant_subspaces``."""
    if solver not in TT_SOLVERS:
        raise ValueError(f"solver={solver!r} is not a TT-SVD solver; choose one of {list(TT_SOLVERS)}")
    if solver != "auto":
        return solver
    return "power" if eps is None and max_ranks is not None else "eigh"


def _progress(total: int, show: bool | None):
    """A tqdm bar over ``total`` blocks if tqdm is importable (transformers depends on it; this file must still load
    with torch alone): ``None`` draws it in a terminal once the work has run ``PROGRESS_DELAY`` seconds, ``True`` at
    once wherever stderr goes; ``False`` (or no tqdm) gives a stand-in whose ``update``/``close`` do nothing."""
    if show is not False:
        try:
            from tqdm.auto import tqdm

            delay, disable = (0, False) if show else (PROGRESS_DELAY, None)  # disable=None: only in a terminal
            return tqdm(total=total, desc="TT-SVD", unit="block", mininterval=0.5, delay=delay, disable=disable)
        except ImportError:
            pass

    class Quiet:
        def update(self, count: int = 1) -> None:
            pass

        def close(self) -> None:
            pass

    return Quiet()


def _orthonormal_basis(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cholesky QR of ``(n, q, r)`` float64 matrices: orthonormal bases of their column spaces, and whether each is
    trustworthy: Cholesky succeeded and ``κ(YᵀY) ≥ (max L_ii / min L_ii)²`` stayed below 1e8, so the lost
    orthogonality (≈ ε·κ) is below 1e-8 (a NaN anywhere fails the comparison too)."""
    chol, info = torch.linalg.cholesky_ex(y.transpose(1, 2) @ y)
    diagonal = chol.diagonal(dim1=1, dim2=2).abs()
    trusted = (info == 0) & (diagonal.amax(dim=1) < 1e4 * diagonal.amin(dim=1))
    return torch.linalg.solve_triangular(chol, y.transpose(1, 2), upper=False).transpose(1, 2), trusted


def _dominant_subspaces(gram: torch.Tensor, rank: int) -> torch.Tensor:
    """Orthonormal bases ``(n, q, rank)`` of the leading ``rank``-dimensional eigenspaces of symmetric PSD ``gram``
    matrices ``(n, q, q)`` without an eigendecomposition per matrix: block power iteration ``G^(2^k) S`` by repeated
    squaring from ``S``, the leading eigenspace of the batch's summed Gram (one small ``eigh``), then Cholesky QR.
    A few batched products and ``rank × rank`` Cholesky factorisations cost a fraction of one LAPACK ``eigh`` per
    matrix. The squarings run in ``gram``'s precision (float32 rounding moves the subspace by ~1e-6, far below what
    truncation discards); Cholesky QR squares the conditioning ``(λ_1/λ_rank)^(2^k)``, so it runs in float64.
    Matrices where it cannot be trusted (rank below ``rank``, zero vectors, too wide a spectrum) are solved exactly
    with ``eigh``.
    """
    start = torch.linalg.eigh(gram.sum(dim=0).double())[1][:, -rank:].to(gram.dtype)
    trace = gram.diagonal(dim1=1, dim2=2).sum(dim=1)
    power = gram * (1 / trace.clamp(min=torch.finfo(gram.dtype).tiny))[:, None, None]  # eigenvalues in [0, 1]
    for _ in range(POWER_SQUARINGS):
        power = power @ power
    basis, trusted = _orthonormal_basis((power @ start).double())
    if not bool(trusted.all()):
        failed = (~trusted).nonzero().squeeze(1)
        basis[failed] = torch.linalg.eigh(gram[failed].double())[1][:, :, -rank:]
    return basis.to(gram.dtype)


def _truncated_svd(
    z: torch.Tensor, choose: Callable[[torch.Tensor], torch.Tensor] | None, cap: int, solver: str = "eigh"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Truncated factorization ``Z ≈ A B`` of a batch of small matrices through their dominant singular subspace.

    ``A B`` is the rank-``r`` SVD truncation of ``Z``; which side carries the singular values is immaterial to the
    train, so none is divided out. Without ``choose`` every matrix keeps ``min(cap, q)`` components (fixed-rank
    TT-SVD); ``choose(s)`` maps the descending singular values ``(n, q)`` to per-matrix ranks ``(n,)``, and
    components beyond a matrix's rank are zeroed. Returns ``A`` ``(n, m, R)``, ``B`` ``(n, R, cols)`` and the ranks.
    The subspace comes from the smaller Gram matrix (``q × q``): ``eigh`` in ``z``'s precision (torch's batched CPU
    SVD runs one LAPACK call per matrix and was 5-20× slower on these tiny shapes, e.g. 49152 matrices of 40×9;
    float64 ``eigh`` cost 10-30 % more than float32 without changing the error), or, with ``solver="power"`` and
    fixed ranks, ``_dominant_subspaces`` (any basis of the subspace gives the same truncation).
    """
    rows, cols = z.shape[-2:]
    wide = rows <= cols
    gram = z @ z.transpose(1, 2) if wide else z.transpose(1, 2) @ z
    size = gram.shape[-1]
    if choose is None:
        ranks = torch.full((z.shape[0],), min(cap, size), dtype=torch.long, device=z.device)
    if solver == "power" and choose is None and cap < size:
        top = _dominant_subspaces(gram, cap)
    else:
        values, vectors = torch.linalg.eigh(gram)
        if choose is not None:
            ranks = choose(values.flip(-1).clamp(min=0).sqrt())
        top = vectors[:, :, size - int(ranks.max()) :].flip(-1)  # leading eigenvectors, descending
    left, right = (top, top.transpose(1, 2) @ z) if wide else (z @ top, top.transpose(1, 2))
    if choose is not None:
        keep = (torch.arange(top.shape[-1], device=z.device)[None, :] < ranks[:, None]).to(z.dtype)
        left, right = left * keep[:, None, :], right * keep[:, :, None]
    return left, right, ranks


def tt_svd(
    vectors: torch.Tensor,
    shape: list[int],
    max_ranks: list[int] | None = None,
    eps: float | torch.Tensor | None = None,
    solver: str = "auto",
    block: int | None = None,
    progress: bool | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """TT-SVD (paper Algorithm 1) of every row of ``vectors``, in blocks of rows with batched decompositions.

    Args:
        vectors: ``(V, d)`` with ``d = prod(shape)``, on any device (the work stays there).
        shape: the tensor folding ``I_1 … I_N`` of each vector.
        max_ranks: upper bounds ``r_1 … r_{N-1}`` (None: no bound).
        eps: relative accuracy; a float, or a ``(V,)`` tensor of per-token accuracies. Each step truncates a
            token at the smallest rank whose discarded singular values have norm ``<= eps/sqrt(N-1)·||x||``.
        solver: ``"auto"`` (``resolve_solver``), ``"eigh"`` (exact dominant subspaces) or ``"power"`` (fixed
            ranks only: block power iteration, see ``_dominant_subspaces``).
        block: rows per block (default ``DECOMPOSE_BLOCK`` over CPU threads, ``DEVICE_BLOCK`` on an accelerator).
            Rows are independent, so the result does not depend on it.
        progress: tqdm bar over the blocks; None shows it in a terminal once the work takes ``PROGRESS_DELAY`` s.

    Memory: each block is converted to float32 on its own (a bfloat16 table is never copied whole), and with
    fixed ranks the cores are preallocated and filled block by block, so the peak is the table, the cores and a
    few blocks' intermediates. In the ε mode the stored ranks are known only at the end: blocks are kept and
    padded to the largest rank (the cores twice, briefly).

    Returns:
        ``cores`` (``(V, R_{k-1}, I_k, R_k)`` each, zero-padded to the largest rank any token got) and
        ``token_ranks`` (``(V, N-1)``, int32, every token's own ranks).
    """
    count, size = vectors.shape
    order = len(shape)
    if math.prod(shape) != size:
        raise ValueError(f"tt shape {shape} has {math.prod(shape)} entries, but the vectors have {size}")
    if max_ranks is not None and len(max_ranks) != order - 1:
        raise ValueError(f"need {order - 1} ranks for a {order}-core train, got {list(max_ranks)}")
    solver = resolve_solver(solver, max_ranks, eps)
    if solver == "power" and (eps is not None or max_ranks is None):
        raise ValueError(
            "solver='power' finds subspaces of fixed dimension: give max_ranks and no eps (eps needs every "
            "singular value; use solver='eigh')"
        )
    on_cpu = vectors.device.type == "cpu"
    block = block or (DECOMPOSE_BLOCK if on_cpu else DEVICE_BLOCK)
    dtype = torch.float64 if vectors.dtype == torch.float64 else torch.float32
    eps_tensor = None if eps is None or order == 1 else torch.as_tensor(eps, device=vectors.device).expand(count)
    starts = range(0, count, block)

    def decompose(start: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        rows = slice(start, start + block)
        work = vectors[rows].detach().to(dtype)
        delta = None if eps_tensor is None else eps_tensor[rows].to(dtype) / math.sqrt(order - 1) * work.norm(dim=1)
        return _tt_svd_block(work, shape, max_ranks, delta, solver)

    bar = _progress(len(starts), progress)
    fixed = _fixed_ranks(shape, max_ranks) if eps is None else None
    if fixed is not None:
        bounds = [1, *fixed, 1]
        cores = [vectors.new_empty(count, bounds[k], shape[k], bounds[k + 1]) for k in range(order)]
        token_ranks = torch.empty(count, order - 1, dtype=torch.int32, device=vectors.device)
    parts = []
    # torch releases the GIL inside its kernels, so the blocks' LAPACK loops (serial per batch) run side by side;
    # an accelerator takes one large block at a time
    workers = min(torch.get_num_threads(), len(starts)) if on_cpu else 1
    with ThreadPoolExecutor(max(workers, 1)) as pool:
        for start, (block_cores, block_ranks) in zip(starts, pool.map(decompose, starts)):
            if fixed is not None:
                rows = slice(start, start + block)
                for core, part in zip(cores, block_cores):
                    core[rows] = part
                token_ranks[rows] = block_ranks
            else:
                parts.append((block_cores, block_ranks))
            bar.update()
    bar.close()
    if fixed is not None:
        return cores, token_ranks
    return _join_blocks(parts, order, vectors.dtype)


def _fixed_ranks(shape: list[int], max_ranks: list[int] | None) -> list[int] | None:
    """The stored ranks of fixed-rank TT-SVD, known before decomposing: ``min(cap, rows, cols)`` of each
    step's unfolding (what ``_truncated_svd`` keeps without ``choose``). None without ``max_ranks``."""
    if max_ranks is None:
        return None
    ranks, rank_in = [], 1
    for k in range(len(shape) - 1):
        rank_in = min(int(max_ranks[k]), rank_in * shape[k], math.prod(shape[k + 1 :]))
        ranks.append(rank_in)
    return ranks


def _join_blocks(parts: list, order: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Blocks of the ε mode store different ranks: zero-pad each to the largest and concatenate."""
    cores = []
    for k in range(order):
        rank_in, rank_out = (max(part[0][k].shape[dim] for part in parts) for dim in (1, 3))
        cores.append(
            torch.cat(
                [
                    F.pad(part[0][k], (0, rank_out - part[0][k].shape[3], 0, 0, 0, rank_in - part[0][k].shape[1]))
                    for part in parts
                ]
            ).to(dtype)
        )
    return cores, torch.cat([part[1] for part in parts])


def _tt_svd_block(
    work: torch.Tensor, shape: list[int], max_ranks: list[int] | None, delta: torch.Tensor | None, solver: str
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``tt_svd`` of one batch of rows; ``delta`` (``(n,)`` or None) are the per-step truncation budgets."""
    count, size = work.shape
    order = len(shape)

    def choose(cap: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if delta is None:
            return None

        def ranks(sigma: torch.Tensor) -> torch.Tensor:
            limit = min(cap, sigma.shape[1])
            # tail[:, j] = norm of singular values j, j+1, ...; the rank is the first j whose tail fits in delta
            tail = torch.flip(torch.cumsum(torch.flip(sigma * sigma, dims=[1]), dim=1), dims=[1]).sqrt()
            return (tail > delta[:, None]).sum(dim=1).clamp(min=1, max=limit)

        return ranks

    cores, ranks = [], []
    remainder = work.reshape(count, shape[0], size // shape[0])
    for k in range(order - 1):
        cap = size if max_ranks is None else int(max_ranks[k])
        u, remainder, token_rank = _truncated_svd(remainder, choose(cap), cap, solver)
        rank_in, stored = u.shape[1] // shape[k], u.shape[2]
        cores.append(u.reshape(count, rank_in, shape[k], stored))
        remainder = remainder.reshape(count, stored * shape[k + 1], -1)
        ranks.append(token_rank)
    cores.append(remainder.reshape(count, -1, shape[-1], 1))
    token_ranks = torch.stack(ranks, dim=1).to(torch.int32) if ranks else torch.zeros(count, 0, dtype=torch.int32)
    return cores, token_ranks


#: Tokens reconstructed per block: the intermediates of a block stay in cache (measured 20-40 % faster than one
#: pass over 32k tokens on CPU, benchmarks/tt_embedding.py).
RECONSTRUCT_BLOCK = 2048


def _contract(picked: list[torch.Tensor]) -> torch.Tensor:
    """``(n, d)`` from the per-token cores ``(n, R_{k-1}, I_k, R_k)``, contracted right to left so that the last
    batched product is ``(I_1 × R_1) @ (R_1 × I_2…I_N)``: wide outputs, which small batched GEMMs handle best."""
    n = picked[0].shape[0]
    out = picked[-1].reshape(n, picked[-1].shape[1], -1)  # (n, R_{N-1}, I_N)
    for core in reversed(picked[:-1]):
        rank_in, mode, rank_out = core.shape[1:]
        out = torch.bmm(core.reshape(n, rank_in * mode, rank_out), out).reshape(n, rank_in, -1)
    return out.reshape(n, -1)


def tt_reconstruct(cores: list[torch.Tensor], ids: torch.Tensor | None = None) -> torch.Tensor:
    """The ``(n, d)`` vectors of tokens ``ids`` (all tokens if None): N-1 batched matrix products per block of
    tokens, no token loop."""
    count = cores[0].shape[0] if ids is None else ids.shape[0]
    size = math.prod(core.shape[2] for core in cores)
    if count <= RECONSTRUCT_BLOCK:
        return _contract(list(cores) if ids is None else [core.index_select(0, ids) for core in cores])
    out = cores[0].new_empty(count, size)
    for start in range(0, count, RECONSTRUCT_BLOCK):
        block = slice(start, start + RECONSTRUCT_BLOCK)
        out[block] = _contract([core[block] if ids is None else core.index_select(0, ids[block]) for core in cores])
    return out
