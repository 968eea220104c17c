"""Turning a requested rank (int, or fraction of dense parameters) into a concrete rank, with clear errors."""

from __future__ import annotations

import math


def resolve_rank(requested: int | float, params_per_rank: int, dense_params: int, max_rank: int, where: str) -> int:
    """An int rank is checked against ``max_rank``; a float ratio keeps at most that fraction of ``dense_params``."""
    if isinstance(requested, float):
        return max(1, min(max_rank, math.floor(requested * dense_params / params_per_rank)))
    if requested > max_rank:
        raise ValueError(
            f"rank {requested} is impossible for {where}: at most {max_rank} "
            f"(a float in (0, 1] asks for a fraction of the dense parameters instead)"
        )
    return requested
