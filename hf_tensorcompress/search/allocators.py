"""The allocations a byte search must beat at equal bytes, without RL: one form everywhere, random forms, and a
greedy HAQ-style allocation by measured sensitivity.

They work on the search's own groups (``forms.LinearSlot``, or the rank-and-width ``AttentionGroup``), each with
its ``actions`` and what an action costs in bytes (``cost(action, True)``), and return ``{group name: action}``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

from .form_swap import form_module, set_linear
from .forms import Form, LinearSlot, form_bytes
from .space import Width

Allocation = dict  # group name -> action


def allocation_bytes(groups: list, allocation: Allocation) -> float:
    """Bytes of every group at ``allocation``."""
    return sum(group.cost(allocation[group.name], True) for group in groups)


def check_budget_fits(slots: list[LinearSlot], byte_budget: float) -> None:
    """Raise where even the cheapest form of every Linear takes more than ``byte_budget`` of their fp32 bytes: a
    search or allocation would end over the budget with every Linear at its cheapest form (no Linears: nothing to
    check)."""
    if not slots:
        return
    cheapest = {slot.name: min(slot.actions, key=lambda form, slot=slot: slot.bytes_at(form)) for slot in slots}
    floor = allocation_bytes(slots, cheapest) / sum(slot.dense_bytes for slot in slots)
    if floor > byte_budget:
        raise ValueError(
            f"byte_budget={byte_budget:.4g}: the cheapest form of every Linear takes {floor:.4g} of the fp32 bytes; "
            "raise the budget or allow cheaper forms (narrower factor_widths, lower ranks, biprop)"
        )


def random_allocation(groups: list, budget: float, rng: random.Random) -> Allocation:
    """A random action per group, groups taken in random order, each drawn among the actions that leave the rest
    room for their cheapest action: never above ``budget`` when the cheapest allocation fits it."""
    allocation = {g.name: min(g.actions, key=lambda a, g=g: g.cost(a, True)) for g in groups}
    for group in rng.sample(groups, len(groups)):
        rest = allocation_bytes(groups, allocation) - group.cost(allocation[group.name], True)
        fitting = [a for a in group.actions if rest + group.cost(a, True) <= budget]
        if fitting:
            allocation[group.name] = rng.choice(fitting)
    return allocation


def greedy_allocation(groups: list, budget: float, sensitivity: dict[str, dict]) -> Allocation:
    """HAQ-style without RL: start every group at its most expensive action and, while over ``budget``, move the
    group whose next cheaper action costs the least loss increase per byte saved (``sensitivity``: group ->
    {action: loss increase of that group alone at that action})."""
    return greedy_with_price(groups, budget, sensitivity)[0]


def greedy_with_price(groups: list, budget: float, sensitivity: dict[str, dict]) -> tuple[Allocation, float]:
    """``greedy_allocation`` and the loss increase per byte saved of its last move: what meeting the budget cost at
    the margin, the price of a byte (0.0 where every group's most expensive action fits)."""
    allocation = {g.name: max(g.actions, key=lambda a, g=g: g.cost(a, True)) for g in groups}
    price = 0.0
    while allocation_bytes(groups, allocation) > budget:
        moves = []
        for index, group in enumerate(groups):
            now = allocation[group.name]
            for slot, action in enumerate(group.actions):
                saved = group.cost(now, True) - group.cost(action, True)
                if saved > 0:
                    cost = sensitivity[group.name][action] - sensitivity[group.name][now]
                    moves.append((max(cost, 0.0) / saved, -saved, index, slot))
        if not moves:
            break
        price, _, index, slot = min(moves)  # on a tie the first move (actions mix ints, "ternary", None and forms)
        allocation[groups[index].name] = groups[index].actions[slot]
    return allocation, price


def uniform_forms(slots: list[LinearSlot], budget: float, kind: str) -> Allocation | None:
    """``kind`` on every Linear, at the setting (width and group, each Linear's scales and input rotation those of
    its first such form; or width and one parameter ratio of every Linear's weights) with the most bytes that fit
    ``budget``; ``None`` where ``kind`` cannot take every Linear or no setting fits. Biprop's bytes do not depend on
    the keep ratio: the middle one of the slots' keep ratios."""
    if any(not any(form.kind == kind for form in slot.actions) for slot in slots):
        return None
    settings: list[Allocation] = []
    if kind == "lowbit":
        options = {(form.bits, form.group) for form in slots[0].actions if form.kind == "lowbit"}
        settings = [{s.name: _lowbit(s, bits, group) for s in slots} for bits, group in options]
    elif kind in ("svd", "cp"):
        widths = {form.bits for form in slots[0].actions if form.kind == kind}
        settings = [
            {s.name: Form(kind, bits, rank=_rank_at(s, kind, step / 100)) for s in slots}
            for bits in widths
            for step in range(1, 101)
        ]
    elif kind == "biprop":
        keeps = sorted(form.keep for form in slots[0].actions if form.kind == "biprop")
        settings = [{s.name: Form("biprop", keep=keeps[len(keeps) // 2]) for s in slots}]
    fitting = [setting for setting in settings if _bytes(slots, setting) <= budget]
    return max(fitting, key=lambda setting: _bytes(slots, setting), default=None)


def _lowbit(slot: LinearSlot, bits: Width, group: int | None) -> Form:
    """The slot's first ``lowbit`` action at ``bits`` and ``group``: its scales and input rotation as the search offers
    them (a Linear that cannot be rotated takes it unrotated)."""
    return next(form for form in slot.actions if form.kind == "lowbit" and (form.bits, form.group) == (bits, group))


def _rank_at(slot: LinearSlot, kind: str, ratio: float) -> int:
    """The rank of ``kind`` that keeps ``ratio`` of the slot's weight parameters (at least 1, at most full)."""
    per_rank = slot.in_features + slot.out_features
    if kind == "cp":
        per_rank = slot.heads + slot.in_features // slot.heads + slot.out_features
    return max(
        1, min(min(slot.in_features, slot.out_features), round(ratio * slot.in_features * slot.out_features / per_rank))
    )


def _bytes(slots: list[LinearSlot], allocation: Allocation) -> float:
    """Bytes of an allocation whose forms may lie outside the slots' actions (a uniform rank)."""
    return sum(form_bytes(slot, allocation[slot.name]) for slot in slots)


@torch.no_grad()
def measure_form_sensitivity(
    model: nn.Module, slots: list[LinearSlot], loss: Callable[[nn.Module], float]
) -> dict[str, dict[Form, float]]:
    """Loss increase of ``model`` (a trained dense model) when one Linear alone takes each of its forms, built from
    its trained weights as the search builds them (no training), through every Linear that shares it: the per-layer
    sensitivity HAQ allocates by."""
    base = loss(model)
    sensitivity: dict[str, dict[Form, float]] = {}
    was_training = model.training
    model.eval()
    for slot in slots:
        dense = model.get_submodule(slot.name)
        sensitivity[slot.name] = {}
        for form in slot.actions:
            if form.kind == "dense":
                sensitivity[slot.name][form] = 0.0
                continue
            set_linear(model, slot.name, form_module(model, slot, dense, form).eval())
            sensitivity[slot.name][form] = loss(model) - base
        set_linear(model, slot.name, dense)
    model.train(was_training)
    return sensitivity
