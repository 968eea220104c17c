"""The simple rank assignments a search must beat at equal size: one rank for every layer, and random ranks.

Both take the attention groups of a compressed model and a parameter count (weights and biases of all searched
projections, what ``AttentionGroup.params_at`` counts) and return ``{group name: rank}``; ``module_ranks`` turns
that into the per-module ``ranks`` of a ``CPConfig``/``SVDConfig``.
"""

from __future__ import annotations

import random

from .space import AttentionGroup


def total_params(groups: list[AttentionGroup], ranks: dict[str, int]) -> int:
    """Parameters of all groups at ``ranks``."""
    return sum(group.params_at(ranks[group.name]) for group in groups)


def _largest_rank(group: AttentionGroup) -> int:
    """The rank at parity with the dense weights (the largest rank the search could choose)."""
    return max(group.candidates)


def uniform_ranks(groups: list[AttentionGroup], params: int) -> dict[str, int]:
    """The same rank in every group, the one whose total parameter count is closest to ``params``."""
    top = min(_largest_rank(group) for group in groups)
    best = min(range(1, top + 1), key=lambda r: (abs(total_params(groups, {g.name: r for g in groups}) - params), r))
    return {group.name: best for group in groups}


def random_ranks(groups: list[AttentionGroup], params: int, rng: random.Random) -> dict[str, int]:
    """Random ranks whose total is ``params`` to within one rank-1 component of one group (never above it,
    unless every group at rank 1 already is).

    The budget beyond rank 1 everywhere is split by a uniform draw on the simplex (Dirichlet(1)), each group's
    share rounded down to whole ranks (capped at parity); what is left goes, one rank at a time, to groups drawn
    at random among those it still fits.
    """
    ranks = {group.name: 1 for group in groups}
    spare = params - total_params(groups, ranks)
    if spare <= 0:
        return ranks
    weights = [rng.expovariate(1.0) for _ in groups]
    scale = sum(weights)
    for group, weight in zip(groups, weights):
        extra = int(weight / scale * spare) // group.params_per_rank
        ranks[group.name] = min(_largest_rank(group), 1 + extra)
    while True:
        left = params - total_params(groups, ranks)
        fits = [g for g in groups if g.params_per_rank <= left and ranks[g.name] < _largest_rank(g)]
        if not fits:
            return ranks
        ranks[rng.choice(fits).name] += 1


def module_ranks(groups: list[AttentionGroup], ranks: dict[str, int]) -> dict[str, int]:
    """``{module name: rank}`` for every projection of every group (the ``ranks`` field of a CP/SVD config)."""
    return {module: int(ranks[group.name]) for group in groups for module in group.modules}
