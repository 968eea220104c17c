"""What the search acts on: one *attention layer* = one attention module whose compressed projections share a rank.

The paper decomposes "a Multi-head Attention layer" as a whole, so the q/k/v projections of one attention module
(those that were compressed) form one group and always hold the same rank. The action space of a group follows
every rank when there are at most ``max_candidates``, else ranks at parameter ratios 0.1 … 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class AttentionGroup:
    """One attention module's compressed projections (full module names) and their shared action space."""

    name: str
    position: int
    modules: tuple[str, ...]
    layer_type: str
    heads: int
    head_dim: int
    dense_weights: int
    params_per_rank: int
    bias_params: int
    candidates: tuple[int, ...]

    @property
    def dense_params(self) -> int:
        """Parameters of the dense projections this group replaced (weights and biases)."""
        return self.dense_weights + self.bias_params

    def params_at(self, rank: int) -> int:
        """Parameters of the whole group at ``rank`` (factors plus the biases, which every rank keeps)."""
        return rank * self.params_per_rank + self.bias_params


def factor_params_per_rank(layer: nn.Module) -> int:
    """Parameters one rank-1 component costs in ``layer`` (sum of the factor matrices' row counts)."""
    return sum(factor.shape[0] for factor in layer.factors)


def candidate_ranks(dense_weights: int, params_per_rank: int, max_candidates: int) -> tuple[int, ...]:
    """Every rank up to parity with the dense weights if that is at most ``max_candidates`` ranks, else ranks at
    parameter ratios 1/n, 2/n, … 1 (n = ``max_candidates``)."""
    full = max(1, dense_weights // params_per_rank)
    if full <= max_candidates:
        return tuple(range(1, full + 1))
    ranks = {
        max(1, math.floor(k / max_candidates * dense_weights / params_per_rank)) for k in range(1, max_candidates + 1)
    }
    return tuple(sorted(ranks))


def attention_groups(model: nn.Module, max_candidates: int = 10) -> list[AttentionGroup]:
    """The searchable groups of a compressed model, in the order of ``config.compression_config['modules']``."""
    recorded = getattr(model.config, "compression_config", None) or {}
    names = list(recorded.get("modules", {}))
    if not names:
        raise ValueError(
            "the model has no compressed modules to search over; call "
            "apply_compression(model, CompressionConfig(method='cp')) (or 'svd') before building the trainer"
        )
    by_parent: dict[str, list[str]] = {}
    for name in names:
        layer = model.get_submodule(name)
        if not hasattr(layer, "set_rank"):
            raise ValueError(f"{name} ({type(layer).__name__}) has no set_rank: the rank search needs CP or SVD layers")
        by_parent.setdefault(name.rpartition(".")[0], []).append(name)
    groups = []
    for position, (parent, members) in enumerate(by_parent.items()):
        layers = [model.get_submodule(name) for name in members]
        types = {layer.layer_type for layer in layers}
        if len(types) != 1:
            raise ValueError(
                f"attention module {parent!r} mixes layer types {sorted(types)}; compress it with one method"
            )
        first = layers[0]
        heads = getattr(first, "num_heads", None) or getattr(model.get_submodule(parent), "num_heads", 1)
        dense = sum(layer.in_features * layer.out_features for layer in layers)
        per_rank = sum(factor_params_per_rank(layer) for layer in layers)
        groups.append(
            AttentionGroup(
                name=parent,
                position=position,
                modules=tuple(members),
                layer_type=types.pop(),
                heads=int(heads),
                head_dim=first.in_features // int(heads),
                dense_weights=dense,
                params_per_rank=per_rank,
                bias_params=sum(layer.bias.numel() for layer in layers if layer.bias is not None),
                candidates=candidate_ranks(dense, per_rank, max_candidates),
            )
        )
    return groups


def current_rank(model: nn.Module, group: AttentionGroup) -> int:
    return model.get_submodule(group.modules[0]).rank


def allowed_actions(
    groups: list[AttentionGroup],
    index: int,
    ranks: dict[str, int],
    decided: set[str],
    budget: float | None,
    width: int,
) -> list[bool]:
    """Mask over the ``width`` action slots of ``groups[index]``: a slot exists and respects the budget wall.

    AMC's wall: rank r is allowed only if this group at r, the decided groups at their ranks and every other
    undecided group at its smallest candidate still fit in ``budget`` × the dense parameters of all groups
    (weights and biases, so the budget is what a parameter count of the projections shows).
    """
    group = groups[index]
    mask = [slot < len(group.candidates) for slot in range(width)]
    if budget is None:
        return mask
    limit = budget * sum(g.dense_params for g in groups)
    others = sum(
        g.params_at(ranks[g.name]) if g.name in decided else g.params_at(g.candidates[0])
        for g in groups
        if g.name != group.name
    )
    walled = [ok and others + group.params_at(group.candidates[slot]) <= limit for slot, ok in enumerate(mask)]
    if not any(walled):  # the budget is unreachable even at the smallest ranks: offer the smallest rank only
        walled = [slot == 0 for slot in range(width)]
    return walled
