"""The tied output layer's logits read from a vocabulary's tensor trains: the factored kernel (``hidden @ Wᵀ``
without building ``W``) and ``TTLogits``, the ``TTEmbedding`` mixin choosing between it and rebuilding rows.

Ships inside saved checkpoints: torch only. The factored kernel serves decoding, where a few hidden rows meet the
whole vocabulary.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

#: How ``TTEmbedding.logits`` computes the tied output layer (see there).
LOGIT_PATHS = ("auto", "factored", "rebuild")


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
    hidden: torch.Tensor,
    cores: list[torch.Tensor] | None,
    ids: torch.Tensor | None = None,
    cut: int | None = None,
    blocks: list[list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``hidden @ Wᵀ`` ``(m, n)`` for the trains of tokens ``ids`` (all if None) without building ``W`` (n × d).

    With the trains split after core ``cut`` into ``left (P_l, R, n)`` and ``right (R, P_r, n)``, token ``t``'s
    logit is ``Σ_{q,r} right[r, q, t] · Σ_p H[p, q] left[p, r, t]`` (``H`` = a hidden vector folded to
    ``P_l × P_r``). The inner sum for a block of tokens is one GEMM ``(m·P_r, P_l) @ (P_l, R·n)``; the rest is
    one multiply and a sum over contiguous token rows. ``blocks`` (``token_minor_blocks(cores, ids)``, e.g.
    kept by the caller between decoding steps, or decoded block by block from low-bit codes with ``cores`` None and
    ``cut`` given) saves gathering and transposing the cores per call. Traffic ≈
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


class TTLogits:
    """The tied output layer of ``TTEmbedding`` (see there for the accessors it reads: ``_train_vectors``,
    ``_basis_matrix``, ``_exact_linear``, ``_token_blocks``)."""

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
        (``(V, d)``, the cached mode of ``TTTiedHead``) replace the rebuild. Low-bit storage is decoded one block
        of tokens at a time on every path."""
        if path not in LOGIT_PATHS:
            raise ValueError(f"path={path!r}; choose one of {list(LOGIT_PATHS)}")
        lead, raw = hidden.shape[:-1], hidden.reshape(-1, hidden.shape[-1])
        basis = self._basis_matrix()
        projected = raw if basis is None else F.linear(raw, basis)
        if path == "auto":
            path = "factored" if self._factored_is_cheaper(raw.shape[0]) else "rebuild"
        if trains is not None:
            logits = self._exact_logits(raw, F.linear(projected, trains))
        elif path == "factored":
            logits = self._factored(raw, projected)
        else:
            ids = torch.arange(self.num_embeddings, device=self.token_ranks.device)
            parts = [
                F.linear(projected, self._train_vectors(ids[start : start + chunk]))
                for start in range(0, self.num_embeddings, chunk)
            ]
            logits = self._exact_logits(raw, torch.cat(parts, dim=-1))
        return logits.reshape(*lead, self.num_embeddings)

    def _factored_is_cheaper(self, rows: int) -> bool:
        """Whether ``factored_logits`` touches fewer floats per token than a (rebuilt or dense) row of ``d``."""
        return best_cut(self.shape, self.ranks, rows)[1] < self.embedding_dim

    def _exact_logits(self, raw: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the exact tokens' columns replaced by ``raw @ exact_rowsᵀ`` (the rows as stored, no gather)."""
        if self.exact_rows is None:
            return logits
        return logits.index_copy(-1, self._token_split()[0], self._exact_linear(raw))

    def _factored(self, raw: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Logits without a ``V×d`` matrix: exact tokens as one dense GEMM over ``exact_rows`` as stored (no
        gather), the other tokens by ``factored_logits`` over their trains only."""
        cut = best_cut(self.shape, self.ranks, raw.shape[0])[0]
        if self.exact_rows is None:
            return factored_logits(projected, None, cut=cut, blocks=self._token_blocks(None))
        by_slot, train_ids = self._token_split()
        logits = raw.new_empty(raw.shape[0], self.num_embeddings)
        logits.index_copy_(1, by_slot, self._exact_linear(raw))
        if train_ids.numel():
            blocks = self._token_blocks(train_ids)
            logits.index_copy_(1, train_ids, factored_logits(projected, None, cut=cut, blocks=blocks))
        return logits

    def _token_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the token of each exact slot, the tokens served by trains), computed once per ``exact_slot``: every
        decoding step needs both, and finding them scans the vocabulary."""
        slot = self.exact_slot
        if self._split_cache is None or not self._split_cache[0].matches([slot]):
            exact_ids = (slot >= 0).nonzero().squeeze(1)
            by_slot = torch.empty_like(exact_ids).index_copy_(0, slot[exact_ids].long(), exact_ids)
            self._split_cache = (TensorsState([slot]), by_slot, (slot < 0).nonzero().squeeze(1))
        return self._split_cache[1], self._split_cache[2]
