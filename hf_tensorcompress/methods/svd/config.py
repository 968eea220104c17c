"""Options of ``method="svd"`` (the truncated-SVD baseline, "SVD-Smartformer")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import RankedConfig


@dataclass
class SVDConfig(RankedConfig):
    """Each target projection becomes ``U Vᵀ`` of rank R.

    Args:
        rank: an int or a float in (0, 1] (fraction of the dense layer's weight parameters kept).
        ranks: per-module overrides, ``{name or suffix: rank}``; the longest key wins.
        init: ``"decompose"`` (truncated SVD of the dense weight: the best rank-R approximation) or ``"random"``.
    """

    method: str = "svd"

    method_name: ClassVar[str] = "svd"
