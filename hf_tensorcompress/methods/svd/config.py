"""Options of ``method="svd"`` (the truncated-SVD baseline, "SVD-Smartformer")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import RankedConfig, one_of
from ...runtime.marker import FACTOR_BITS, check_factor_storage


@dataclass
class SVDConfig(RankedConfig):
    """Each target projection becomes ``U Vᵀ`` of rank R.

    Args:
        rank: an int or a float in (0, 1] (fraction of the dense layer's weight parameters kept).
        ranks: per-module overrides, ``{name or suffix: rank}``; the longest key wins.
        init: ``"decompose"`` (truncated SVD of the dense weight: the best rank-R approximation) or ``"random"``.
        factor_bits: store ``U`` and ``Vᵀ`` as packed integer codes of this many bits (2, 3, 4 or 8; ``runtime/lowbit``:
            round-to-nearest per group with an fp16 scale and minimum) instead of fp32; ``None`` keeps fp32. The
            layer trains with its factors rounded the way they will be stored (straight-through gradients to the
            fp32 factors), and a saved checkpoint holds only the codes, in the file and, once loaded, in memory.
        factor_group_size: columns per scale/minimum group of each factor row; ``None`` (or a size that does not
            divide a row) is one group per row.
    """

    method: str = "svd"
    factor_bits: int | None = one_of(None, FACTOR_BITS)
    factor_group_size: int | None = None

    method_name: ClassVar[str] = "svd"

    def validate(self) -> None:
        super().validate()
        check_factor_storage(self.factor_bits, self.factor_group_size)
