"""Tensor-train token embeddings (TensorSLM): every token's vector is its own tensor train.

Ships inside saved checkpoints: torch only.

Storage layout: core ``k`` of the whole vocabulary is one parameter of shape ``(V, R_{k-1}, I_k, R_k)``
(``R_0 = R_N = 1``). ``R_k`` are the layer's *stored* ranks. When tokens get different ranks (the ε mode, or
weighted per-token budgets), each token's train is zero-padded up to ``R_k``: the padded slices are exact zeros,
so reconstruction is unaffected, and the per-token ranks are kept in the ``token_ranks`` buffer. Parameter
counts are therefore reported twice: ``stored_parameters()`` (what this padded layout holds) and
``effective_parameters()`` (Σ over tokens of Σ_k r_{k-1} I_k r_k, what a ragged layout would hold).
The vocabulary axis is never factorized, so single tokens can be added, replaced or removed.
"""

from __future__ import annotations

import math
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...core.contract import CompressedLayer


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
        while factor ** slots <= rest:
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
TT_SOLVERS = ("auto", "eigh", "power")

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

#: A progress bar is shown for tables of at least this many entries (SmolLM2's 28M decompose in seconds; an 8B
#: model's 128k × 4096 = 537M take minutes on a CPU).
PROGRESS_ENTRIES = 1 << 27


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


def _progress(total: int, show: bool):
    """A tqdm bar over ``total`` blocks if ``show`` and tqdm is importable (transformers depends on it; this file
    must still load with torch alone), else a stand-in whose ``update``/``close`` do nothing."""
    if show:
        try:
            from tqdm.auto import tqdm

            return tqdm(total=total, desc="TT-SVD", unit="block", mininterval=2)
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
        progress: tqdm bar over the blocks; None shows it for tables of ``PROGRESS_ENTRIES`` entries or more.

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

    bar = _progress(len(starts), count * size >= PROGRESS_ENTRIES if progress is None else progress)
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
        cores.append(torch.cat([
            F.pad(part[0][k], (0, rank_out - part[0][k].shape[3], 0, 0, 0, rank_in - part[0][k].shape[1]))
            for part in parts
        ]).to(dtype))
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


def _partial_trains(cores: list[torch.Tensor], cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The trains split after core ``cut``, token index last: left ``(P_l, R, n)`` and right ``(R, P_r, n)`` with
    ``P_l = I_1…I_cut``, ``R = R_cut``, so token ``t``'s vector is ``Σ_r left[:, r, t] ⊗ right[r, :, t]``.

    ``cores`` are token-minor ``(R_{k-1}, I_k, R_k, n)``: every step is ``R`` broadcast multiply-adds whose inner
    loop runs over the ``n`` tokens, contiguous. In the stored token-major layout the inner loops are a few
    elements long (``I_k``, ``R_k``), and torch's CPU ``bmm`` pays a fixed cost per tiny matrix: both ran 5-20×
    slower over a vocabulary (benchmarks/tt_generate.py)."""
    first = cores[0]
    left = first.reshape(first.shape[1], first.shape[2], -1)  # (I_1, R_1, n)
    for core in cores[1:cut]:
        out = left[:, 0, None, None, :] * core[0][None]
        for r in range(1, core.shape[0]):
            out = out.addcmul(left[:, r, None, None, :], core[r][None])
        left = out.reshape(-1, core.shape[2], core.shape[3])  # (P·I_k, R_k, n)
    last = cores[-1]
    right = last.reshape(last.shape[0], last.shape[1], -1)  # (R_{N-1}, I_N, n)
    for core in reversed(cores[cut:-1]):
        out = core[:, :, 0, None, :] * right[0][None, None]
        for r in range(1, core.shape[2]):
            out = out.addcmul(core[:, :, r, None, :], right[r][None, None])
        right = out.reshape(core.shape[0], -1, out.shape[-1])  # (R_{k-1}, I_k·P, n)
    return left, right


def _factored_cost(shape: list[int], ranks: list[int], cut: int, rows: int) -> int:
    """Estimated floats written per token by ``factored_logits`` split after core ``cut`` for ``rows`` hidden
    vectors: both partial trains as they are built, and the GEMM's output ``R·rows·P_r``. A dense or rebuilt
    row costs ``d``; the comparison picks the path (``TTEmbedding.logits``)."""
    bounds = [1, *ranks, 1]
    build, size = 0, 1
    for k in range(1, cut + 1):
        size *= shape[k - 1]
        build += size * bounds[k]
    size = 1
    for k in range(len(shape) - 1, cut - 1, -1):
        size *= shape[k]
        build += bounds[k] * size
    return build + bounds[cut] * rows * math.prod(shape[cut:])


def best_cut(shape: list[int], ranks: list[int], rows: int) -> tuple[int, int]:
    """(cut, cost): where to split the trains for ``rows`` hidden vectors, the cheapest by ``_factored_cost``."""
    return min(((cut, _factored_cost(shape, ranks, cut, rows)) for cut in range(1, len(shape))), key=lambda x: x[1])


class TensorsState:
    """Which tensors, at which version, a derived value was computed from: a cache stays valid while the very same
    tensors (not a new one at a recycled address) are unchanged in place."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.refs = [weakref.ref(t) for t in tensors]
        self.marks = [(t._version, t.data_ptr(), t.device) for t in tensors]

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        return len(tensors) == len(self.refs) and all(
            ref() is t and mark == (t._version, t.data_ptr(), t.device)
            for ref, mark, t in zip(self.refs, self.marks, tensors)
        )


#: Tokens per block of ``factored_logits``: its temporaries (partial trains, the GEMM's output) stay under ~1 MB
#: and in cache whatever the vocabulary. Larger blocks were no faster and left the freed temporaries in the C
#: allocator's heap: 4096 raised peak RSS of batch-8 generation by ~5 MB, the whole vocabulary at once by ~24 MB
#: (benchmarks/tt_generate.py).
FACTORED_BLOCK = 2048


def token_minor_blocks(cores: list[torch.Tensor], ids: torch.Tensor | None = None) -> list[list[torch.Tensor]]:
    """The cores of tokens ``ids`` (all if None) in blocks of ``FACTORED_BLOCK`` tokens, each core token-minor
    ``(R_{k-1}, I_k, R_k, n)``: the layout ``factored_logits`` reads (see ``_partial_trains``)."""
    count = cores[0].shape[0] if ids is None else ids.shape[0]
    blocks = []
    for start in range(0, count, FACTORED_BLOCK):
        block = slice(start, start + FACTORED_BLOCK)
        picked = [core[block] if ids is None else core.index_select(0, ids[block]) for core in cores]
        blocks.append([core.permute(1, 2, 3, 0).contiguous() for core in picked])
    return blocks


def factored_logits(
    hidden: torch.Tensor, cores: list[torch.Tensor], ids: torch.Tensor | None = None, cut: int | None = None,
    blocks: list[list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``hidden @ Wᵀ`` ``(m, n)`` for the trains of tokens ``ids`` (all if None) without building ``W`` (n × d).

    With the trains split after core ``cut`` into ``left (P_l, R, n)`` and ``right (R, P_r, n)``, token ``t``'s
    logit is ``Σ_{q,r} right[r, q, t] · Σ_p H[p, q] left[p, r, t]`` (``H`` = a hidden vector folded to
    ``P_l × P_r``). The inner sum for a block of tokens is one GEMM ``(m·P_r, P_l) @ (P_l, R·n)``; the rest is
    one multiply and a sum over contiguous token rows. ``blocks`` (``token_minor_blocks(cores, ids)``, e.g.
    kept by the caller between decoding steps) saves gathering and transposing the cores per call. Traffic ≈
    ``n·R·(P_l + m·P_r)`` floats against ``n·d`` for a dense matrix: it wins while ``R·m`` is small (decoding),
    and loses to rebuilding the rows for long inputs.
    """
    m = hidden.shape[0]
    if cut is None:
        cut = best_cut([core.shape[2] for core in cores], [core.shape[3] for core in cores[:-1]], m)[0]
    out = []
    for picked in token_minor_blocks(cores, ids) if blocks is None else blocks:
        left, right = _partial_trains(picked, cut)
        p_left, rank, n = left.shape
        p_right = right.shape[1]
        folded = hidden.reshape(m, p_left, p_right).transpose(1, 2).reshape(m * p_right, p_left)
        inner = (folded @ left.reshape(p_left, rank * n)).reshape(m, p_right * rank, n)
        out.append((inner * right.transpose(0, 1).reshape(1, p_right * rank, n)).sum(dim=1))
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)


class TTEmbedding(CompressedLayer):
    """Drop-in for ``nn.Embedding``: token ``t``'s vector is the tensor train ``G_1[t] G_2[t] … G_N[t]``.

    ``forward(ids)`` reconstructs only the requested tokens. ``weight`` reconstructs the whole ``(V, d)`` matrix
    (used by ``resize_token_embeddings`` and by the tied output head). ``eps`` and ``max_ranks`` are kept so that
    tokens added later are compressed the same way; a new token never gets ranks above the stored ones.
    """

    layer_type = "tt_embedding"

    def __init__(
        self,
        num_embeddings: int,
        shape: list[int],
        ranks: list[int],
        eps: float | None = None,
        tied_output: str | None = None,
        basis: bool = False,
        exact_tokens: int = 0,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        shape, ranks = [int(i) for i in shape], [int(r) for r in ranks]
        if len(ranks) != len(shape) - 1 or min(shape) < 1 or (ranks and min(ranks) < 1):
            raise ValueError(f"a {len(shape)}-core train needs {len(shape) - 1} ranks >= 1; got shape={shape}, ranks={ranks}")
        self.shape, self.ranks, self.eps, self.tied_output = shape, ranks, eps, tied_output
        size = math.prod(shape)
        # optional output-aware basis P (d×d): vector = train @ P; the trains live in the basis P⁻¹ (see tt_basis)
        self.register_buffer("basis", torch.eye(size, device=device, dtype=dtype) if basis else None)
        # optional exact tokens: their vectors are stored dense (exact_rows[slot]); exact_slot[t] = slot or -1
        self.exact_rows = nn.Parameter(torch.zeros(exact_tokens, size, device=device, dtype=dtype)) if exact_tokens else None
        self.register_buffer(
            "exact_slot",
            torch.full((num_embeddings,), -1, dtype=torch.int32, device=device) if exact_tokens else None,
        )
        bounds = [1, *ranks, 1]
        self.cores = nn.ParameterList(
            nn.Parameter(torch.zeros(num_embeddings, bounds[k], shape[k], bounds[k + 1], device=device, dtype=dtype))
            for k in range(len(shape))
        )
        self.register_buffer(
            "token_ranks", torch.tensor(ranks, dtype=torch.int32, device=device).repeat(num_embeddings, 1)
        )
        self._split_cache: tuple | None = None  # see _token_split
        self._blocks_cache: tuple | None = None  # see _decode_blocks

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A random train per token, every token at the stored ranks, in the identity basis, no exact tokens: the
        init of a layer no checkpoint filled. Each core is N(0, σ²) with ``σ^(2N) · Π r_k = 1``, so vectors have
        unit variance like ``nn.Embedding``'s N(0, 1) rows."""
        order = len(self.shape)
        std = math.prod(self.ranks) ** (-1.0 / (2 * order))
        for core in self.cores:
            nn.init.normal_(core, 0.0, std)
        self.token_ranks.copy_(torch.tensor(self.ranks, dtype=torch.int32).expand_as(self.token_ranks))
        if self.basis is not None:
            self.basis.copy_(torch.eye(self.embedding_dim))
        if self.exact_rows is not None:
            nn.init.zeros_(self.exact_rows)
            self.exact_slot.fill_(-1)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_weight(
        cls,
        weight: torch.Tensor,
        shape: list[int],
        max_ranks: list[int] | None = None,
        eps: float | torch.Tensor | None = None,
        basis: torch.Tensor | None = None,
        solver: str = "auto",
    ) -> "TTEmbedding":
        """Compress a ``(V, d)`` embedding matrix (training-free). A tensor ``eps`` gives per-token accuracies.

        ``basis`` (``(d, d)``, invertible) decomposes the rows of ``W P⁻¹`` instead of ``W`` and stores ``P``:
        vectors are ``train @ P``. With ``P⁻¹ = C^{1/2} Q`` (``C`` the covariance of the hidden states the tied
        output layer sees, ``Q`` the principal axes of ``W C^{1/2}``) truncation minimises the logit error
        ``E‖h·(w − ŵ)‖²`` rather than ``‖w − ŵ‖²``: see ``methods.tt.output_basis``. ``solver``: see
        ``tt_svd`` (default ``"auto"``: power iteration for fixed ranks, eigh for the ε mode; tokens added later
        always use the exact ``"eigh"``: a handful of vectors gains nothing from ``"power"``).
        """
        if max_ranks is None and eps is None:
            raise ValueError("give max_ranks, eps, or both: without either TT-SVD keeps every vector exactly")
        inverse = None if basis is None else torch.linalg.inv(basis.double())
        target = weight if inverse is None else (weight.double() @ inverse).to(weight.dtype)
        cores, token_ranks = tt_svd(target, shape, max_ranks, eps, solver)
        layer = cls(
            weight.shape[0],
            shape,
            [core.shape[-1] for core in cores[:-1]],
            eps=float(eps) if isinstance(eps, (int, float)) else None,
            basis=basis is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        layer._load(cores, token_ranks)
        if basis is not None:
            layer.basis.copy_(basis)
        return layer

    @torch.no_grad()
    def keep_exact(self, ids: torch.Tensor, vectors: torch.Tensor) -> None:
        """Serve tokens ``ids`` from dense rows ``vectors`` (e.g. the most frequent tokens), the rest from trains."""
        ids, order = torch.as_tensor(ids, dtype=torch.long).sort()
        rows = vectors[order].detach().to(self.cores[0])
        old = self.exact_rows
        self.exact_rows = nn.Parameter(rows.clone(), True if old is None else old.requires_grad)
        slot = torch.full((self.num_embeddings,), -1, dtype=torch.int32, device=self.cores[0].device)
        slot[ids.to(slot.device)] = torch.arange(len(ids), dtype=torch.int32, device=slot.device)
        self.exact_slot = slot

    def _exact(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(token ids, their dense rows) of the exact tokens, or None."""
        if self.exact_rows is None:
            return None
        ids = (self.exact_slot >= 0).nonzero().squeeze(1)
        return ids, self.exact_rows.index_select(0, self.exact_slot[ids].long())

    def _load(self, cores: list[torch.Tensor], token_ranks: torch.Tensor) -> dict[nn.Parameter, nn.Parameter]:
        """Replace all cores (new Parameters); returns ``{old: new}`` for ``replace_parameters_in_optimizer``."""
        mapping = {}
        for k, core in enumerate(cores):
            old = self.cores[k]
            new = nn.Parameter(core.detach().to(old.device, old.dtype).contiguous(), old.requires_grad)
            self.cores[k] = new
            mapping[old] = new
        self.token_ranks = token_ranks.to(self.token_ranks.device, torch.int32)
        return mapping

    def _compress(self, vectors: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """New vectors compressed like this layer's tokens, padded to the stored ranks."""
        vectors = vectors.to(self.cores[0])
        if self.basis is not None:
            vectors = torch.linalg.solve(self.basis.double().T, vectors.double().T).T.to(vectors.dtype)
        cores, token_ranks = tt_svd(vectors, self.shape, self.ranks, self.eps, solver="eigh")
        bounds = [1, *self.ranks, 1]
        padded = [
            F.pad(core, (0, bounds[k + 1] - core.shape[-1], 0, 0, 0, bounds[k] - core.shape[1]))
            for k, core in enumerate(cores)
        ]
        return padded, token_ranks

    # ------------------------------------------------------------------ adaptive vocabulary (paper §2.1)
    @torch.no_grad()
    def add_tokens(self, vectors: torch.Tensor) -> tuple[torch.Tensor, dict[nn.Parameter, nn.Parameter]]:
        """Append tokens whose vectors are ``vectors`` ``(n, d)``, compressed on the fly.

        Returns the new token ids and ``{old: new}`` parameters (for an optimizer holding the cores).
        """
        vectors = torch.as_tensor(vectors).reshape(-1, self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        start = self.num_embeddings
        mapping = self._load(
            [torch.cat([old.detach(), new]) for old, new in zip(self.cores, new_cores)],
            torch.cat([self.token_ranks, new_ranks.to(self.token_ranks.device)]),
        )
        if self.exact_slot is not None:
            self.exact_slot = torch.cat([self.exact_slot, self.exact_slot.new_full((vectors.shape[0],), -1)])
        return torch.arange(start, start + vectors.shape[0]), mapping

    @torch.no_grad()
    def remove_tokens(self, ids: torch.Tensor | list[int]) -> dict[nn.Parameter, nn.Parameter]:
        """Drop tokens ``ids``; the tokens after them move down (like removing rows of the embedding matrix)."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise IndexError(f"token ids must lie in [0, {self.num_embeddings}), got {ids.min()}..{ids.max()}")
        keep = torch.ones(self.num_embeddings, dtype=torch.bool)
        keep[ids] = False
        kept = keep.nonzero().squeeze(1).to(self.token_ranks.device)
        mapping = self._load([core.detach().index_select(0, kept) for core in self.cores], self.token_ranks[kept])
        if self.exact_slot is not None:
            slot = self.exact_slot[kept].clone()
            alive = slot >= 0
            old = self.exact_rows
            self.exact_rows = nn.Parameter(old.detach()[slot[alive].long()], old.requires_grad)
            slot[alive] = torch.arange(int(alive.sum()), dtype=slot.dtype, device=slot.device)
            self.exact_slot = slot
            mapping[old] = self.exact_rows
        return mapping

    @torch.no_grad()
    def set_vectors(self, ids: torch.Tensor | list[int], vectors: torch.Tensor) -> None:
        """Re-compress tokens ``ids`` to new vectors in place (e.g. after ``resize_token_embeddings``)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.token_ranks.device).reshape(-1)
        vectors = torch.as_tensor(vectors).reshape(ids.numel(), self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        for core, new in zip(self.cores, new_cores):
            core[ids] = new  # through the Parameter, not .data: bumps _version, so caches see the change
        self.token_ranks[ids] = new_ranks.to(self.token_ranks.device)
        if self.exact_slot is not None:
            slot = self.exact_slot[ids]
            self.exact_rows[slot[slot >= 0].long()] = vectors[slot >= 0].to(self.exact_rows)

    @torch.no_grad()
    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None) -> "TTEmbedding":
        """``resize_token_embeddings`` support, in place: new tokens start at the mean vector, as transformers'
        ``mean_resizing`` does (without its random perturbation, so resizing is deterministic); shrinking drops
        the last tokens."""
        target = self.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of:
            target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
        if target > self.num_embeddings:
            mean = self.weight.detach().mean(dim=0, keepdim=True)
            self.add_tokens(mean.expand(target - self.num_embeddings, -1))
        elif target < self.num_embeddings:
            self.remove_tokens(torch.arange(target, self.num_embeddings))
        return self

    # ------------------------------------------------------------------ model integration
    def bind(self, model: nn.Module) -> None:
        """Called once the layer sits in ``model``: take over the tied output layer (or untie it).

        transformers ties ``lm_head.weight`` to the embedding's ``weight`` parameter, which no longer exists, so
        the config's tying is switched off; a tied model gets a ``TTTiedHead`` reading this layer's cores.
        """
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        for config in {id(model.config): model.config, id(text_config): text_config}.values():
            if getattr(config, "tie_word_embeddings", False):
                config.tie_word_embeddings = False
        if hasattr(model, "all_tied_weights_keys"):
            model.all_tied_weights_keys = {}
        if self.tied_output is not None:
            model.set_submodule(self.tied_output, TTTiedHead(self))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        vectors = self._apply_basis(tt_reconstruct(list(self.cores), flat))
        if self.exact_rows is not None:
            slot = self.exact_slot[flat].long()
            exact = self.exact_rows.index_select(0, slot.clamp(min=0))
            vectors = torch.where((slot >= 0)[:, None], exact, vectors)
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def _apply_basis(self, trains: torch.Tensor) -> torch.Tensor:
        return trains if self.basis is None else trains @ self.basis

    def logits(
        self, hidden: torch.Tensor, trains: torch.Tensor | None = None, chunk: int = 4096, path: str = "auto"
    ) -> torch.Tensor:
        """``hidden @ weightᵀ`` over the whole vocabulary, the basis applied to ``hidden`` (``L·d²``) rather than to
        all V trains, exact tokens as one dense block.

        ``path``: ``"factored"`` contracts the projected hidden states with the trains of the non-exact tokens
        (``factored_logits``, no ``V×d`` matrix); ``"rebuild"`` (the reference) rebuilds every train ``chunk``
        tokens at a time and overwrites the exact tokens; ``"auto"`` takes ``"factored"`` while its estimated cost
        per token (``best_cut``) is below a dense row's ``d``, i.e. for the few rows of decoding, and
        ``"rebuild"`` for long inputs, where one rebuilt matrix serves many rows. Precomputed ``trains``
        (``(V, d)``, the cached mode of ``TTTiedHead``) replace the rebuild."""
        if path not in LOGIT_PATHS:
            raise ValueError(f"path={path!r}; choose one of {list(LOGIT_PATHS)}")
        lead, raw = hidden.shape[:-1], hidden.reshape(-1, hidden.shape[-1])
        projected = raw if self.basis is None else F.linear(raw, self.basis)
        if path == "auto":
            path = "factored" if self._factored_is_cheaper(raw.shape[0]) else "rebuild"
        if trains is not None:
            logits = self._exact_logits(raw, F.linear(projected, trains))
        elif path == "factored":
            logits = self._factored(raw, projected)
        else:
            cores, vocab = list(self.cores), self.num_embeddings
            ids = torch.arange(vocab, device=cores[0].device)
            logits = self._exact_logits(raw, torch.cat(
                [F.linear(projected, tt_reconstruct(cores, ids[start : start + chunk])) for start in range(0, vocab, chunk)],
                dim=-1,
            ))
        return logits.reshape(*lead, self.num_embeddings)

    def _factored_is_cheaper(self, rows: int) -> bool:
        """Whether ``factored_logits`` touches fewer floats per token than a (rebuilt or dense) row of ``d``."""
        return best_cut(self.shape, [core.shape[-1] for core in self.cores[:-1]], rows)[1] < self.embedding_dim

    def _exact_logits(self, raw: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the exact tokens' columns replaced by ``raw @ exact_rowsᵀ`` (the rows as stored, no gather)."""
        if self.exact_rows is None:
            return logits
        return logits.index_copy(-1, self._token_split()[0], F.linear(raw, self.exact_rows))

    def _factored(self, raw: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Logits without a ``V×d`` matrix: exact tokens as one dense GEMM over ``exact_rows`` as stored (no
        gather), the other tokens by ``factored_logits`` over their trains only."""
        cores = list(self.cores)
        if self.exact_rows is None:
            return factored_logits(projected, cores, blocks=self._decode_blocks(None))
        by_slot, train_ids = self._token_split()
        logits = raw.new_empty(raw.shape[0], self.num_embeddings)
        logits.index_copy_(1, by_slot, F.linear(raw, self.exact_rows))
        if train_ids.numel():
            logits.index_copy_(1, train_ids, factored_logits(projected, cores, train_ids,
                                                             blocks=self._decode_blocks(train_ids)))
        return logits

    def __getstate__(self) -> dict:
        """Pickled without the decoding caches (they hold weak references, and are rebuilt on use)."""
        return {**super().__getstate__(), "_split_cache": None, "_blocks_cache": None}

    def _token_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the token of each exact slot, the tokens served by trains), computed once per ``exact_slot``: every
        decoding step needs both, and finding them scans the vocabulary."""
        slot = self.exact_slot
        if self._split_cache is None or not self._split_cache[0].matches([slot]):
            exact_ids = (slot >= 0).nonzero().squeeze(1)
            by_slot = torch.empty_like(exact_ids).index_copy_(0, slot[exact_ids].long(), exact_ids)
            self._split_cache = (TensorsState([slot]), by_slot, (slot < 0).nonzero().squeeze(1))
        return self._split_cache[1], self._split_cache[2]

    def _decode_blocks(self, ids: torch.Tensor | None) -> list[list[torch.Tensor]] | None:
        """The train tokens' cores laid out for ``factored_logits``, kept between decoding steps while the cores
        and ``ids`` are unchanged (the size of those cores; transposing them per step cost a sixth of a step).
        None while the cores train: the layout must follow their gradients, so it is built per call."""
        if torch.is_grad_enabled() and any(core.requires_grad for core in self.cores):
            self._blocks_cache = None
            return None
        sources = [*self.cores] + ([] if ids is None else [ids])
        if self._blocks_cache is None or not self._blocks_cache[0].matches(sources):
            self._blocks_cache = None  # free the old layout before building the new one
            self._blocks_cache = (TensorsState(sources), token_minor_blocks(list(self.cores), ids))
        return self._blocks_cache[1]

    @property
    def weight(self) -> torch.Tensor:
        """The whole ``(V, d)`` embedding matrix, reconstructed (differentiable w.r.t. the cores)."""
        weight = self._apply_basis(tt_reconstruct(list(self.cores)))
        exact = self._exact()
        return weight if exact is None else weight.index_copy(0, exact[0], exact[1])

    @property
    def num_embeddings(self) -> int:
        return self.cores[0].shape[0]

    @property
    def embedding_dim(self) -> int:
        return math.prod(self.shape)

    def spec(self) -> dict:
        return {
            "type": self.layer_type,
            "num_embeddings": self.num_embeddings,
            "shape": list(self.shape),
            "ranks": list(self.ranks),
            "eps": self.eps,
            "tied_output": self.tied_output,
            "basis": self.basis is not None,
            "exact_tokens": 0 if self.exact_rows is None else self.exact_rows.shape[0],
        }

    @classmethod
    def from_spec(cls, spec: dict) -> "TTEmbedding":
        return cls(
            spec["num_embeddings"], spec["shape"], spec["ranks"], spec.get("eps"), spec.get("tied_output"),
            spec.get("basis", False), spec.get("exact_tokens", 0),
        )

    # ------------------------------------------------------------------ size and cost
    def dense_parameters(self) -> int:
        """Parameters of the ``nn.Embedding`` this layer replaces (a tied output layer shares them)."""
        return self.num_embeddings * self.embedding_dim

    def stored_parameters(self) -> int:
        return sum(core.numel() for core in self.cores) + self._basis_parameters()

    def _basis_parameters(self) -> int:
        """The basis matrix and the dense rows of exact tokens (their trains are still stored and counted)."""
        return (0 if self.basis is None else self.basis.numel()) + (
            0 if self.exact_rows is None else self.exact_rows.numel()
        )

    def effective_parameters(self) -> int:
        """Σ over tokens of Σ_k r_{k-1} I_k r_k with every token's own ranks (what a ragged layout stores)."""
        ones = torch.ones(self.num_embeddings, 1, dtype=torch.long, device=self.token_ranks.device)
        bounds = torch.cat([ones, self.token_ranks.long(), ones], dim=1)
        modes = torch.tensor(self.shape, device=bounds.device)
        return int((bounds[:, :-1] * modes * bounds[:, 1:]).sum()) + self._basis_parameters()

    def reconstruct_multiply_adds(self) -> int:
        """Multiply-adds to rebuild one token's vector from its (stored-rank) train."""
        bounds, rows, total = [1, *self.ranks, 1], self.shape[0], 0
        for k in range(1, len(self.shape)):
            total += rows * bounds[k] * self.shape[k] * bounds[k + 1]
            rows *= self.shape[k]
        return total

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        """Multiply-adds of looking up ``tokens`` tokens (one train contraction each)."""
        return tokens * self.reconstruct_multiply_adds(), "tt-reconstruct"

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, shape={self.shape}, ranks={self.ranks}, eps={self.eps}"


#: How ``TTEmbedding.logits`` computes the tied output layer (see there).
LOGIT_PATHS = ("auto", "factored", "rebuild")

#: ``TTTiedHead.mode`` values: a ``LOGIT_PATHS`` entry, or ``"cached"`` (one rebuilt ``V×d`` copy kept).
HEAD_MODES = (*LOGIT_PATHS, "cached")


class TTTiedHead(nn.Module):
    """The output layer of a tied model: ``logits = h Wᵀ`` read from the TT embedding's cores.

    It owns no tensors (the tied matrix is counted once, in the embedding). ``mode`` (default ``"auto"``):
    ``"auto"``/``"factored"``/``"rebuild"`` are ``TTEmbedding.logits`` paths: for the one row per sequence of
    ``generate()`` (transformers passes ``logits_to_keep=1``) ``"auto"`` contracts the hidden state with the
    factored trains, never building the ``V×d`` matrix, so decoding costs no more than the dense head and holds no
    dense copy; for long inputs it rebuilds the matrix ``chunk`` tokens at a time (a transient of one chunk).
    ``"cached"`` keeps one rebuilt ``V×d`` copy while the cores are unchanged (dense memory, dense speed, for
    evaluation loops over long windows); ``cache_weight = True`` is the older spelling of it.
    """

    def __init__(self, embedding: TTEmbedding) -> None:
        super().__init__()
        object.__setattr__(self, "embedding", embedding)  # a reference, not a submodule: no duplicate state
        self.mode = "auto"
        self._cache: tuple[tuple, torch.Tensor] | None = None

    @property
    def cache_weight(self) -> bool:
        return self.mode == "cached"

    @cache_weight.setter
    def cache_weight(self, value: bool) -> None:
        self.mode = "cached" if value else "auto"

    @property
    def in_features(self) -> int:
        return self.embedding.embedding_dim

    @property
    def out_features(self) -> int:
        return self.embedding.num_embeddings

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def _cached_trains(self) -> torch.Tensor | None:
        """The rebuilt ``(V, d)`` trains in the cached mode while nothing needs gradients, else None (and the
        copy is dropped). Rebuilt only when a core was replaced, moved or changed in place."""
        if self.mode != "cached" or torch.is_grad_enabled():
            self._cache = None
            return None
        cores = list(self.embedding.cores)
        if self._cache is None or not self._cache[0].matches(cores):
            self._cache = None  # free the old copy before building the new one
            self._cache = (TensorsState(cores), tt_reconstruct(cores))
        return self._cache[1]

    def __getstate__(self) -> dict:
        """Pickled without the cached copy (it holds weak references, and is rebuilt on use)."""
        return {**super().__getstate__(), "_cache": None}

    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None) -> "TTTiedHead":
        """Nothing to do: the head follows the embedding's vocabulary."""
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.mode not in HEAD_MODES:
            raise ValueError(f"TTTiedHead.mode={self.mode!r}; choose one of {list(HEAD_MODES)}")
        trains = self._cached_trains()
        return self.embedding.logits(hidden, trains, path="rebuild" if self.mode == "cached" else self.mode)

    def extra_repr(self) -> str:
        return f"tied to TTEmbedding({self.out_features}, {self.in_features}), mode={self.mode}"
