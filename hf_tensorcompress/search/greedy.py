"""The forms of a search over forms allocated greedily by measured sensitivity (HAQ without RL), for a user to apply.

On the CPU table of the results page this allocation lost least at 1/16 of the bytes and never collapsed, so it is
offered beside the RL search rather than only as its baseline: it reads a *trained* dense model, where the search
decides while the model trains.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..config import CompressionConfig
from ..methods.mixed.config import shared_forms
from .allocators import check_budget_fits, greedy_allocation, measure_form_sensitivity
from .config import SearchConfig
from .forms import linear_slots, mixed_forms


def greedy_forms(model: nn.Module, search: SearchConfig, loss: Callable[[nn.Module], float]) -> CompressionConfig:
    """``CompressionConfig(method="mixed", forms=...)``: a form for every Linear ``search`` targets, among the forms,
    widths, group sizes, ranks and keep ratios it allows, within its ``byte_budget``.

    Each Linear of ``model`` (trained, dense) is put alone in each of its forms, built from its trained weight, and
    ``loss(model)`` (lower is better: a validation MSE, say) scores it; from every Linear at its costliest form, the
    move that costs the least loss per byte saved is taken until the bytes fit. ``model`` is left as it was. Apply the
    result to ``model`` (and train on: every form trains in the precision it stores) or to a fresh model. With
    ``search.shared``, ``model`` is the dense model trained with those shares (``method="mixed"``'s shared forms), each
    source measured through every use, and the result keeps the shares (apply it to a fresh model).
    """
    if search.forms is None or search.byte_budget is None:
        raise ValueError(
            "greedy_forms allocates the forms of a search over forms within its bytes: pass a SearchConfig with "
            "forms=(...) and byte_budget=..., e.g. SearchConfig(forms=('dense', 'lowbit', 'svd'), "
            "factor_widths=(4, 2), byte_budget=1 / 16)"
        )
    for name, source in (search.shared or {}).items():
        if getattr(model.get_submodule(name), "source", None) != source:
            raise ValueError(
                f"SearchConfig shared[{name!r}] = {source!r}, but {name} of this model does not share it: measure on "
                "the model trained with the shares, apply_compression(model, CompressionConfig(method='mixed', "
                f"forms={{{name!r}: {{'method': 'shared', 'source': {source!r}}}, ...}})) then trained"
            )
    slots = linear_slots(model, search)
    if not slots:
        raise ValueError(f"target_modules={search.target_modules!r} names no Linear of {type(model).__name__}")
    check_budget_fits(slots, search.byte_budget)
    budget = search.byte_budget * sum(slot.dense_bytes for slot in slots)
    allocation = greedy_allocation(slots, budget, measure_form_sensitivity(model, slots, loss))
    forms = mixed_forms(slots, allocation)
    if not forms:
        raise ValueError(f"byte_budget={search.byte_budget:.4g} keeps every Linear dense: nothing to compress")
    return CompressionConfig(method="mixed", forms=forms | shared_forms(search.shared))
