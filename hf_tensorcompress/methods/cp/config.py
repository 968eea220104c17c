"""Options of ``method="cp"`` (Smartformer's CP attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import RankedConfig, check_int, one_of
from ...runtime.marker import FACTOR_WIDTHS, check_factor_storage


@dataclass
class CPConfig(RankedConfig):
    """Each target projection becomes rank-R CP factors of its ``heads × head_dim × out`` folded weight.

    Args:
        rank: an int (the rank of every target) or a float in (0, 1]: the fraction of each dense layer's weight
            parameters the compressed layer may keep (rank rounded down, at least 1).
        ranks: per-module overrides, ``{name or suffix: rank}``, same rules as ``rank``; the longest key wins.
        init: ``"decompose"`` (factors from the existing dense weights) or ``"random"``.
        cp_iterations: ALS iterations of the initial CP decomposition (tensorly ``parafac``, SVD init).
        factor_bits: store the three factors as packed integer codes of this many bits (8, 4, 3, 2 or 1, a sign
            at each group's mean magnitude; ``runtime/factor_storage``), as bfloat16 (16) or as ternary codes
            (``"ternary"``: BitNet b1.58 levels {-s, 0, +s} per group, s the least-squares level of its codes, five
            codes a byte) instead of fp32; trained rounded as stored, saved and loaded as codes.
        factor_group_size: columns (rank components) per scale/minimum group; ``None`` (or a size that does not
            divide the rank) is one group per factor row.
    """

    method: str = "cp"
    cp_iterations: int = 100
    factor_bits: int | str | None = one_of(None, FACTOR_WIDTHS)
    factor_group_size: int | None = None

    method_name: ClassVar[str] = "cp"

    def validate(self) -> None:
        super().validate()
        check_int(self.cp_iterations, "cp_iterations", 1)
        check_factor_storage(self.factor_bits, self.factor_group_size)
