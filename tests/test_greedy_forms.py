"""``greedy_forms``: the search over forms' greedy allocation as a library function a user applies."""

from __future__ import annotations

import copy

import pytest
import torch
from smartformer_fixtures import dense_patchtst, sines

from hf_tensorcompress import apply_compression
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.search import SearchConfig, greedy_forms
from hf_tensorcompress.search.forms import linear_slots

FORMS = dict(
    forms=("dense", "lowbit", "svd", "biprop"), factor_widths=(4, 2), weight_group_sizes=(16,), max_candidates=2
)


def window_loss(model: torch.nn.Module) -> float:
    """Forecast MSE of ``model`` on a few held-out sine windows."""
    windows = sines(200, seed=2)
    batch = {key: torch.stack([windows[i][key] for i in range(0, 64, 4)]) for key in ("past_values", "future_values")}
    with torch.no_grad():
        forecast = model(past_values=batch["past_values"]).prediction_outputs
    return float((forecast - batch["future_values"]).square().mean())


@pytest.mark.parametrize("budget", [1 / 8, 1 / 3])
def test_greedy_forms_fit_the_budget_and_leave_the_model_as_it_was(budget):
    model = dense_patchtst(layers=1).eval()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    types = {name: type(module) for name, module in model.named_modules()}
    search = SearchConfig(byte_budget=budget, **FORMS)
    config = greedy_forms(model, search, window_loss)
    assert {name: type(module) for name, module in model.named_modules()} == types
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    slots = linear_slots(model, search)
    apply_compression(model, config)
    rows = linear_bytes(model)["modules"]
    stored = sum(rows[slot.name]["disk"] for slot in slots)
    assert stored <= budget * sum(slot.dense_bytes for slot in slots)
    assert stored > budget * sum(slot.dense_bytes for slot in slots) / 3  # the budget is spent, not skipped
    assert set(config.forms) <= {slot.name for slot in slots}


def test_greedy_forms_keep_the_linear_that_matters_wide():
    """A Linear the plain allocation compresses gets more bytes once its every other form costs 100 times the loss."""
    model = dense_patchtst(layers=1).eval()
    search = SearchConfig(byte_budget=1 / 2, **FORMS)  # room to keep one small Linear dense
    plain = greedy_forms(model, search, window_loss)
    name = min(plain.forms, key=lambda linear: model.get_submodule(linear).weight.numel())

    def heavy(candidate: torch.nn.Module) -> float:
        changed = type(candidate.get_submodule(name)) is not torch.nn.Linear
        return window_loss(candidate) * (100.0 if changed else 1.0)

    def bytes_of(config) -> int:
        return linear_bytes(apply_compression(copy.deepcopy(model), config))["modules"][name]["disk"]

    assert bytes_of(greedy_forms(model, search, heavy)) > bytes_of(plain)


def test_greedy_forms_refuse_what_cannot_be_allocated():
    model = dense_patchtst(layers=1)
    with pytest.raises(ValueError, match="forms=.*byte_budget"):
        greedy_forms(model, SearchConfig(), window_loss)
    with pytest.raises(ValueError, match="cheapest form of every Linear"):
        greedy_forms(model, SearchConfig(byte_budget=1e-4, **FORMS), window_loss)
    with pytest.raises(ValueError, match="keeps every Linear dense"):
        greedy_forms(model, SearchConfig(byte_budget=1.0, **FORMS), window_loss)
