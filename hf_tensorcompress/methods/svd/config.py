"""Options of ``method="svd"`` (the truncated-SVD baseline, "SVD-Smartformer")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import RankedConfig, one_of
from ...runtime.marker import FACTOR_WIDTHS, check_factor_storage


@dataclass
class SVDConfig(RankedConfig):
    """Each target projection becomes ``U Vᵀ`` of rank R.

    Args:
        rank: an int or a float in (0, 1] (fraction of the dense layer's weight parameters kept).
        ranks: per-module overrides, ``{name or suffix: rank}``; the longest key wins.
        init: ``"decompose"`` (truncated SVD of the dense weight: the best rank-R approximation) or ``"random"``.
        factor_bits: store ``U`` and ``Vᵀ`` as packed integer codes of this many bits (8, 4, 3 or 2; ``runtime/lowbit``:
            round-to-nearest per group with an fp16 scale and minimum; 1: a sign at each group's mean magnitude), as
            bfloat16 values (16), or as ternary codes (``"ternary"``: BitNet b1.58 levels {-s, 0, +s} per group, s the
            least-squares level of its codes, five codes a byte and one fp16 s per group) instead of fp32; ``None``
            keeps fp32. The layer trains with its factors rounded the way they will be stored (straight-through gradients to the
            fp32 factors), and a saved checkpoint holds only the codes, in the file and, once loaded, in memory.
        factor_group_size: columns per scale/minimum group of each factor row; ``None`` (or a size that does not
            divide a row) is one group per row.
    """

    method: str = "svd"
    factor_bits: int | str | None = one_of(None, FACTOR_WIDTHS)
    factor_group_size: int | None = None

    method_name: ClassVar[str] = "svd"

    def validate(self) -> None:
        super().validate()
        check_factor_storage(self.factor_bits, self.factor_group_size)
