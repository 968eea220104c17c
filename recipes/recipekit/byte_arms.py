"""The byte search's arms: ``smartformer-bytes`` (rank and factor width of every Linear chosen by the RL search under a
byte budget) and, at the bytes each seed's search ended with, the allocations a user could make without RL: one
rank and width everywhere, random ones, and a greedy HAQ-style allocation by measured sensitivity; plus int4/int2
weight QAT of every Linear (the quantization a user would train instead)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch.nn.utils import parametrize

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.compress import refresh_compression_config
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.runtime.factor_storage import rounded, stored_form
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS
from hf_tensorcompress.search.space import AttentionGroup, Width

from .costs import scope_names
from .quantization_arms import low_rank_targets

#: Factor widths the byte search and its baselines choose among: every width ``factor_bits`` stores.
BYTE_WIDTHS = FACTOR_WIDTHS
#: Group size of the low-bit factors and of the int-N QAT weights (as the PTQ baselines' int4/int2).
GROUP = 32
#: Arms derived from each seed's byte search: its final bytes, allocated other ways.
BYTE_DERIVED = ("uniform-q4-bytes", "random-bytes", "greedy-bytes")
#: Weight QAT of every Linear in int-N groups of 32 (straight-through), deployed as those codes.
INT_QAT_ARMS = ("qat-int4-all", "qat-int2-all")

Allocation = dict[str, tuple[int, Width]]  # group name -> (rank, factor width)


def prepare_allocation(groups: list[AttentionGroup] | None, allocation: Allocation | None) -> Callable:
    """An arm's ``prepare``: every Linear of ``low_rank_targets`` as ``U Vᵀ`` at full rank (the search's start,
    ``allocation`` None) or at the allocation's rank and factor width per group, trained at that width."""

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        targets = low_rank_targets(model)
        ranks = {name: min(m.in_features, m.out_features) for name, m in targets.items()}
        bits: dict[str, Width] = {}
        for group in groups or []:
            for name in group.modules:
                ranks[name], bits[name] = allocation[group.name]
        apply_compression(model, CompressionConfig(method="svd", target_modules=list(ranks), rank=1.0, ranks=ranks))
        for name, width in bits.items():
            model.get_submodule(name).set_factor_bits(width, GROUP)
        refresh_compression_config(model)

    return prepare


def searched_byte_budget(model: torch.nn.Module, ratio: float) -> tuple[float, int]:
    """(the fraction of the searched Linears' fp32 bytes, how many Linears stay fp32) that keeps *every* Linear within
    ``ratio`` of its fp32 bytes: the search acts on ``low_rank_targets``; the Linears too narrow to factor (a patch
    embedding) stay fp32 and spend part of the budget first. A ``ValueError`` when they alone exceed it."""
    every = linear_bytes(model)["modules"]
    searched = low_rank_targets(model)
    total = sum(row["dense"] for row in every.values())
    kept = sum(row["dense"] for name, row in every.items() if name not in searched)
    if ratio * total <= kept:
        raise ValueError(
            f"--budget-ratio {ratio:.4g}: the Linears too narrow to factor (fp32, {kept:,} bytes) already hold "
            f"{kept / total:.4f} of every Linear's fp32 bytes; pass a larger ratio"
        )
    return (ratio * total - kept) / (total - kept), len(every) - len(searched)


def allocation_bytes(groups: list[AttentionGroup], allocation: Allocation) -> float:
    return sum(group.bytes_at(*allocation[group.name]) for group in groups)


def uniform_allocation(groups: list[AttentionGroup], budget: float, bits: int = 4) -> Allocation:
    """One parameter ratio and one width for every group: the largest common ratio whose bytes fit ``budget``."""
    best = {g.name: (g.candidates[0], bits) for g in groups}
    for step in range(1, 101):
        ratio = step / 100
        trial = {
            g.name: (max(1, min(max(g.candidates), round(ratio * g.dense_weights / g.params_per_rank))), bits)
            for g in groups
        }
        if allocation_bytes(groups, trial) <= budget:
            best = trial
    return best


def random_allocation(groups: list[AttentionGroup], budget: float, rng: random.Random) -> Allocation:
    """A random (rank, width) per group, groups taken in random order, each drawn among the actions that leave the
    rest room for their cheapest action: never above ``budget`` when the cheapest allocation fits it."""
    allocation = {g.name: min(g.actions, key=lambda a, g=g: g.bytes_at(*a)) for g in groups}
    for group in rng.sample(groups, len(groups)):
        rest = allocation_bytes(groups, allocation) - group.bytes_at(*allocation[group.name])
        fitting = [a for a in group.actions if rest + group.bytes_at(*a) <= budget]
        if fitting:
            allocation[group.name] = rng.choice(fitting)
    return allocation


def greedy_allocation(groups: list[AttentionGroup], budget: float, sensitivity: dict[str, dict]) -> Allocation:
    """HAQ-style without RL: start every group at its most expensive action and, while over ``budget``, move the
    group whose next cheaper action costs the least loss increase per byte saved (``sensitivity``: group ->
    {(rank, bits): loss increase of that group alone at that action})."""
    allocation = {g.name: max(g.actions, key=lambda a, g=g: g.bytes_at(*a)) for g in groups}
    while allocation_bytes(groups, allocation) > budget:
        moves = []
        for group in groups:
            now = allocation[group.name]
            for action in group.actions:
                saved = group.bytes_at(*now) - group.bytes_at(*action)
                if saved > 0:
                    cost = sensitivity[group.name][action] - sensitivity[group.name][now]
                    moves.append((max(cost, 0.0) / saved, -saved, group.name, action))
        if not moves:
            break
        # on a tie the first move: actions are not ordered (their widths mix ints, "ternary" and None)
        _, _, name, action = min(moves, key=lambda move: move[:3])
        allocation[name] = action
    return allocation


@torch.no_grad()
def measure_sensitivity(
    model: torch.nn.Module, groups: list[AttentionGroup], loss: Callable[[torch.nn.Module], float]
) -> dict[str, dict]:
    """Loss increase of ``model`` (a trained dense model) when one group alone is replaced by its truncated SVD at
    each (rank, width) action, factors rounded to that width: the per-layer sensitivity HAQ allocates by."""
    base = loss(model)
    sensitivity: dict[str, dict] = {}
    for group in groups:
        originals = {name: model.get_submodule(name).weight.detach().clone() for name in group.modules}
        sensitivity[group.name] = {}
        for rank, bits in group.actions:
            for name, weight in originals.items():
                u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)
                root = s[:rank].sqrt()
                out_t, in_t = (u[:, :rank] * root).float(), (vh[:rank] * root[:, None]).float()
                if bits is not None:
                    out_t, in_t = rounded(out_t, bits, GROUP), rounded(in_t, bits, GROUP)
                model.get_submodule(name).weight.copy_(out_t @ in_t)
            sensitivity[group.name][(rank, bits)] = loss(model) - base
        for name, weight in originals.items():
            model.get_submodule(name).weight.copy_(weight)
    return sensitivity


class IntWeight(torch.nn.Module):
    """Weight rounded as ``LowBitTensor`` stores it (``bits``, groups of 32 along a row), straight-through."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits = bits

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return rounded(weight, self.bits, GROUP)


def prepare_int_qat(bits: int) -> Callable:
    """An arm's ``prepare``: every Linear trains with int-``bits`` weights; returns their deployed disk bytes."""

    def prepare(model: torch.nn.Module, final_ranks) -> dict[str, int]:
        packed = {}
        for name in scope_names(model, "all"):
            module = model.get_submodule(name)
            parametrize.register_parametrization(module, "weight", IntWeight(bits))
            codes = stored_form((module.out_features, module.in_features), bits, GROUP).storage_bits() // 8
            packed[name] = codes + (module.bias.numel() * 4 if module.bias is not None else 0)
        return packed

    return prepare


def byte_derived_arms(
    name: str,
    groups: list[AttentionGroup],
    searched: Allocation,
    seed: int,
    draws: int,
    sensitivity: Callable[[], dict[str, dict]],
) -> list[tuple[str, int | None, Callable, Allocation]]:
    """(run name, draw, prepare, allocation) of a derived arm at the bytes of the search's final allocation."""
    budget = allocation_bytes(groups, searched)
    if name == "uniform-q4-bytes":
        allocations = [(None, uniform_allocation(groups, budget))]
    elif name == "random-bytes":
        allocations = [
            (draw, random_allocation(groups, budget, random.Random(1000 * seed + draw))) for draw in range(draws)
        ]
    else:
        allocations = [(None, greedy_allocation(groups, budget, sensitivity()))]
    return [(name, draw, prepare_allocation(groups, chosen), chosen) for draw, chosen in allocations]


class FirstWindows(torch.utils.data.Dataset):
    """The first ``count`` windows of ``windows``, scored as the whole set is (``scored_mask``: missing values and
    covariates unscored), so a sensitivity measured on them counts what the test metric counts."""

    def __init__(self, windows: torch.utils.data.Dataset, count: int) -> None:
        self.windows, self.count = windows, min(count, len(windows))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.windows[index]

    def scored_mask(self, index: int) -> torch.Tensor:
        if hasattr(self.windows, "scored_mask"):
            return self.windows.scored_mask(index)
        return torch.ones_like(self.windows[index]["future_values"], dtype=torch.bool)
