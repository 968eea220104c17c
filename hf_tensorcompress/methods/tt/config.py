"""Options of ``method="tt"`` (TensorSLM tensor-train token embeddings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import CompressionConfig, check_choice, check_int, one_of
from ...runtime.marker import FACTOR_BITS
from .choices import TT_SOLVERS

#: Bases the trains are built in.
TT_BASES = ("identity", "pca", "output")

#: Orders in which ``tt_exact_tokens`` picks its dense rows (calibration.EXACT_PRIORS, kept torch-free here).
EXACT_PRIORS = ("calibration", "token_id", "mixed")


def _positive_ints(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    )


@dataclass
class TTConfig(CompressionConfig):
    """Each token vector of the input embedding becomes a tensor train; training-free.

    Args:
        tt_shape: the folding ``I_1 × … × I_N`` of each token vector (product = hidden size).
        tt_order: N for an automatic balanced folding (used when ``tt_shape`` is None; default 3).
        tt_ranks: maximum TT ranks, one int for all ``r_1 … r_{N-1}`` or a list of N-1 ints.
        tt_eps: TT-SVD accuracy ε (paper Algorithm 1), alone or together with ``tt_ranks``.
        tt_basis: the basis the trains are built in. ``"identity"`` (the paper), ``"pca"`` (principal axes of the
            embedding matrix) or ``"output"`` (output-aware: whitened by the covariance of the hidden states the
            tied output layer sees, then principal axes; needs calibration text, see ``apply_tt``). A non-identity
            basis stores one extra ``d×d`` matrix.
        tt_solver: how TT-SVD finds each token's dominant subspaces. ``"auto"`` (default: ``"power"`` for fixed
            ranks, ``"eigh"`` when ``tt_eps`` is given), ``"eigh"`` (exact, LAPACK) or ``"power"`` (fixed ranks only:
            block power iteration, 2.4-3.6× faster than ``"eigh"`` on SmolLM2's vocabulary, reconstruction error
            1.006× exact at 8×8×9, ranks 5,5; tokens whose spectrum it cannot resolve fall back to ``eigh``).
        tt_exact_tokens: serve this many of the most frequent tokens of the calibration text from dense rows
            (exact), the rest from their trains (needs calibration text, see ``apply_tt``); tokens the calibration
            text never used follow in token-id order (``tt_exact_prior`` chooses other orders).
        tt_exact_prior: which tokens ``tt_exact_tokens`` keeps dense: ``"calibration"`` (default: counts of the
            calibration text), ``"token_id"`` (the lowest ids: BPE tokenizers number tokens in merge order, roughly
            by frequency in their broad training corpus; needs no calibration text) or ``"mixed"`` (the calibration
            text's most frequent half, then lowest ids).
        tt_untie_output: on a model with a tied output layer, keep a dense copy of the output matrix (the untied
            variant) instead of reading logits from the TT cores.
        tt_storage_bits: store the trains, exact rows and basis as packed integer codes of this many bits (2, 3, 4
            or 8; ``runtime/lowbit``: an fp16 scale and minimum per group), on disk and in memory; None keeps floats.
            All cores of a token are one row of codes, rebalanced so that they share one range.
        tt_storage_group_size: values per scale group: must divide the hidden size (exact rows and the basis are
            grouped along it); a token's train row uses it where it divides that row, else one group per token.
            None: one group per row.
    """

    method: str = "tt"
    tt_shape: list[int] | None = None
    tt_order: int | None = None
    tt_ranks: int | list[int] | None = None
    tt_eps: float | None = None
    tt_basis: str = one_of("identity", TT_BASES)
    tt_solver: str = one_of("auto", TT_SOLVERS)
    tt_exact_tokens: int = 0
    tt_exact_prior: str = one_of("calibration", EXACT_PRIORS)
    tt_untie_output: bool = False
    tt_storage_bits: int | None = one_of(None, FACTOR_BITS)
    tt_storage_group_size: int | None = None

    method_name: ClassVar[str] = "tt"

    def validate(self) -> None:
        super().validate()
        self._validate_shape()
        self._validate_ranks()
        if self.tt_eps is not None and (
            isinstance(self.tt_eps, bool) or not isinstance(self.tt_eps, (int, float)) or not 0 < self.tt_eps < 1
        ):
            raise ValueError(f"tt_eps must be a float in (0, 1) (relative reconstruction error), got {self.tt_eps!r}")
        check_choice(self.tt_basis, "tt_basis", TT_BASES)
        check_choice(self.tt_solver, "tt_solver", TT_SOLVERS)
        if self.tt_solver == "power" and (self.tt_eps is not None or self.tt_ranks is None):
            raise ValueError(
                "tt_solver='power' keeps fixed ranks: give tt_ranks and no tt_eps (the ε mode needs every singular "
                "value; use tt_solver='eigh')"
            )
        check_int(self.tt_exact_tokens, "tt_exact_tokens", 0, " (tokens kept dense)")
        check_choice(self.tt_exact_prior, "tt_exact_prior", EXACT_PRIORS)
        if not isinstance(self.tt_untie_output, bool):
            raise ValueError(f"tt_untie_output must be True or False, got {self.tt_untie_output!r}")
        self._validate_storage()
        if self.tt_ranks is None and self.tt_eps is None:
            raise ValueError("method='tt' needs tt_ranks (max TT ranks), tt_eps (accuracy), or both")

    def _validate_storage(self) -> None:
        bits, group = self.tt_storage_bits, self.tt_storage_group_size
        if bits is not None and (isinstance(bits, bool) or bits not in FACTOR_BITS):
            raise ValueError(f"tt_storage_bits={bits!r}: choose one of {list(FACTOR_BITS)}, or None for float storage")
        if group is not None:
            check_int(group, "tt_storage_group_size", 1, " (values per scale group, or None: one group per row)")
            if bits is None:
                raise ValueError("tt_storage_group_size groups low-bit codes: give tt_storage_bits too (e.g. 4)")

    def _validate_shape(self) -> None:
        if self.tt_shape is not None:
            if not _positive_ints(self.tt_shape) or len(self.tt_shape) < 2:
                raise ValueError(f"tt_shape must be a list of >= 2 ints >= 1 (e.g. [8, 8, 9]), got {self.tt_shape!r}")
            if self.tt_order is not None and self.tt_order != len(self.tt_shape):
                raise ValueError(f"tt_order={self.tt_order} contradicts tt_shape={self.tt_shape}; give one of them")
            self.tt_shape = list(self.tt_shape)
        if self.tt_order is not None:
            check_int(self.tt_order, "tt_order", 2, " (the number of TT cores)")

    def _validate_ranks(self) -> None:
        if self.tt_ranks is None:
            return
        single = isinstance(self.tt_ranks, int) and not isinstance(self.tt_ranks, bool)
        if not _positive_ints([self.tt_ranks] if single else self.tt_ranks):
            raise ValueError(f"tt_ranks must be an int >= 1 or a list of ints >= 1, got {self.tt_ranks!r}")
        if single:
            return
        self.tt_ranks = list(self.tt_ranks)
        order = len(self.tt_shape) if self.tt_shape is not None else self.tt_order
        if order is not None and len(self.tt_ranks) != order - 1:
            raise ValueError(
                f"tt_ranks={self.tt_ranks} has {len(self.tt_ranks)} entries; a {order}-core train needs "
                f"{order - 1} (or pass one int for all)"
            )
