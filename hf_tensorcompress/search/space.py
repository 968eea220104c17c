"""What the search acts on: one *attention layer* = one attention module whose compressed projections share a rank.

The paper decomposes "a Multi-head Attention layer" as a whole, so the q/k/v projections of one attention module
(those that were compressed) form one group and always hold the same rank. The action space of a group follows
every rank when there are at most ``max_candidates``, else ranks at parameter ratios 0.1 … 1.0. In the byte search
(``SearchConfig.factor_widths``) an action is a (rank, factor bit width) pair, and a group is costed in bytes as
stored (``bytes_at``), so a layer can trade rank for width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from ..runtime.factor_storage import stored_form

#: A factor width an action chooses: bits (16, 8, 4, 3, 2, 1), ``"ternary"``, or ``None`` for fp32 factors.
Width = int | str | None
#: The fields of a group's token string (the state encoder's input), after the paper (Cai et al. 2018).
FIELDS = ("type", "pos", "heads", "dim", "rank")


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
    shapes: tuple[tuple[int, int], ...] = ()
    widths: tuple[Width, ...] = (None,)
    group_size: int | None = None

    @property
    def actions(self) -> tuple[tuple[int, Width], ...]:
        """The (rank, factor width) pairs an action chooses among; width ``None`` is fp32 factors."""
        return tuple((rank, bits) for bits in self.widths for rank in self.candidates)

    @property
    def dense_bytes(self) -> int:
        """fp32 bytes of the dense projections this group replaced (weights and biases)."""
        return 4 * self.dense_params

    def bytes_at(self, rank: int, bits: Width = None) -> float:
        """Bytes of the whole group at ``rank`` with factors stored in ``bits`` (codes, scales and minima, as
        ``LowRankLinear.storage_bits`` counts them), plus the fp32 biases."""
        if bits is None:
            return 4 * self.params_at(rank)
        factor_bits = sum(
            stored_form(shape, bits, self.group_size).storage_bits()
            for out_features, in_features in self.shapes
            for shape in ((out_features, rank), (rank, in_features))
        )
        return factor_bits / 8 + 4 * self.bias_params

    def cost(self, action: tuple[int, Width], in_bytes: bool) -> float:
        """What the budget counts of ``action``: bytes as stored, or parameters."""
        return self.bytes_at(*action) if in_bytes else self.params_at(action[0])

    def describe(self, action: tuple[int, Width]) -> list[str]:
        """The token string of this group at ``action``, e.g. ``['type:cp', 'pos:0', 'heads:4', 'dim:8', 'rank:6']``
        (plus ``'bits:4'`` when the search chooses widths)."""
        rank, bits = action
        values = (self.layer_type, self.position, self.heads, self.head_dim, rank)
        tokens = [f"{name}:{value}" for name, value in zip(FIELDS, values)]
        return tokens if self.widths == (None,) else [*tokens, f"bits:{bits}"]

    @staticmethod
    def dump(action: tuple[int, Width]) -> list:
        return [action[0], action[1]]

    @staticmethod
    def parse(value) -> tuple[int, Width]:
        """An action as saved (a [rank, bits] pair, or a bare rank from a rank-only search)."""
        return (int(value), None) if isinstance(value, int) else (int(value[0]), value[1])

    @staticmethod
    def rank_of(action: tuple[int, Width]) -> int:
        return action[0]

    @staticmethod
    def bits_of(action: tuple[int, Width]) -> Width:
        return action[1]

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


def attention_groups(
    model: nn.Module,
    max_candidates: int = 10,
    widths: tuple[Width, ...] = (None,),
    group_size: int | None = None,
) -> list[AttentionGroup]:
    """The searchable groups of a compressed model, in the order of ``config.compression_config['modules']``;
    ``widths``: the factor bit widths an action may choose (``None``: fp32), which needs SVD layers."""
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
        if widths != (None,) and types != {"svd"}:
            raise ValueError(
                f"{parent!r} holds {sorted(types)} layers: the byte search chooses factor widths of SVD layers; "
                "compress with CompressionConfig(method='svd', target_modules=[...])"
            )
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
                shapes=tuple((layer.out_features, layer.in_features) for layer in layers),
                widths=tuple(widths),
                group_size=group_size,
            )
        )
    return groups


def current_rank(model: nn.Module, group: AttentionGroup) -> int:
    return model.get_submodule(group.modules[0]).rank


def current_bits(model: nn.Module, group: AttentionGroup) -> Width:
    return getattr(model.get_submodule(group.modules[0]), "factor_bits", None)


def allowed_actions(
    groups: list,
    index: int,
    chosen: dict,
    decided: set[str],
    budget: float | None,
    width: int,
    in_bytes: bool = False,
) -> list[bool]:
    """Mask over the ``width`` action slots of ``groups[index]``: a slot exists and respects the budget wall.

    AMC's wall: an action is allowed only if this group with it, the decided groups as they are (``chosen``: each
    group's current action) and every other undecided group at its cheapest action still fit in ``budget`` × the
    dense cost of all groups: parameters (weights and biases, so the budget is what a parameter count of the
    projections shows) or, with ``in_bytes``, bytes as stored against fp32.
    """
    group = groups[index]
    mask = [slot < len(group.actions) for slot in range(width)]
    if budget is None:
        return mask
    dense = sum(g.dense_bytes if in_bytes else g.dense_params for g in groups)
    others = sum(
        g.cost(chosen[g.name], in_bytes) if g.name in decided else min(g.cost(action, in_bytes) for action in g.actions)
        for g in groups
        if g.name != group.name
    )
    walled = [
        ok and others + group.cost(group.actions[slot], in_bytes) <= budget * dense for slot, ok in enumerate(mask)
    ]
    if not any(walled):  # the budget is unreachable even at the cheapest actions: offer the cheapest one only
        cheapest = min(range(len(group.actions)), key=lambda slot: group.cost(group.actions[slot], in_bytes))
        walled = [slot == cheapest for slot in range(width)]
    return walled
