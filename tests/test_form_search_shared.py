"""``SearchConfig.shared``: the search over forms on a model whose later layers compute with the first's Linears
(cross-layer sharing). The shared Linears are not searched and store nothing; every form the search gives a source is
measured and trained through every use, and the saved model loads with the shares, scoring as it trained."""

from __future__ import annotations

import re

import pytest
import torch
from smartformer_fixtures import assert_forecasts_in_new_processes, dense_patchtst, search_trainer, sines

from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.loading import load_model
from hf_tensorcompress.methods.mixed.shared import SharedLinear
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import measure_form_sensitivity
from hf_tensorcompress.search.form_swap import prepare_for_forms
from hf_tensorcompress.search.forms import Form, linear_slots

FORMS = dict(forms=("dense", "lowbit", "svd"), factor_widths=(4, 2, "ternary"), weight_group_sizes=(16,))


def second_layer_shares_first(model) -> dict[str, str]:
    """Every Linear of encoder layer 1 sharing its counterpart in layer 0."""
    later = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers.1." in name]
    return {name: re.sub(r"\.layers\.1\.", ".layers.0.", name) for name in later}


def config(shared: dict[str, str], **overrides) -> SearchConfig:
    options = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=1 / 8, **FORMS)
    return SearchConfig(shared=shared, **{**options, **overrides})


def test_shared_linears_are_not_searched_and_the_budget_is_of_the_searched_ones():
    model = dense_patchtst(layers=2)
    shared = second_layer_shares_first(model)
    slots = linear_slots(model, config(shared))
    names = {slot.name for slot in slots}
    assert shared and not names & set(shared) and set(shared.values()) <= names
    assert len(slots) == len(linear_slots(model, SearchConfig(**{**FORMS, "byte_budget": 1 / 8}))) - len(shared)


def test_config_refuses_a_chain_a_self_share_and_a_source_the_search_does_not_act_on():
    with pytest.raises(ValueError, match="not itself shared"):
        config({"a": "b", "b": "c"})
    with pytest.raises(ValueError, match="not itself shared"):
        config({"a": "a"})
    with pytest.raises(ValueError, match="dict of"):
        config(["a"])
    with pytest.raises(ValueError, match="options of the search over forms"):
        SearchConfig(shared={"a": "b"})
    model = dense_patchtst(layers=2)
    shared = second_layer_shares_first(model)
    search = config(shared, target_modules=["q_proj"])  # the FFN's sources are not searched
    before = {name: p.clone() for name, p in model.state_dict().items()}
    with pytest.raises(ValueError, match="must be a Linear the search acts on"):
        prepare_for_forms(model, linear_slots(model, search), shared)
    with pytest.raises(
        ValueError, match="'model.encoder.layers.7.ff.0', which is not a Linear of PatchTSTForPrediction"
    ):
        prepare_for_forms(model, linear_slots(model, config({})), {"model.encoder.layers.7.ff.0": next(iter(shared))})
    assert not hasattr(model.config, "compression_config")  # nothing changed
    assert all(torch.equal(p, before[name]) for name, p in model.state_dict().items())


def test_a_measured_form_reaches_every_use_of_the_linear():
    """Sensitivity through a share: a source put in a cheap form changes the shared layer's output too (the loss
    moves more than with the share pointing at the original, dense module), and the model is restored after."""
    model = dense_patchtst(layers=2).eval()
    shared = second_layer_shares_first(model)
    slots = linear_slots(model, config(shared))
    prepare_for_forms(model, slots, shared)
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        before = model(past_values=past).prediction_outputs
    name = next(iter(shared))
    seen = {}

    def loss(m):
        seen.setdefault("source", m.get_submodule(shared[name]))
        assert m.get_submodule(name).source_layer is m.get_submodule(shared[name])  # linked to what is there now
        return 0.0

    measure_form_sensitivity(model, slots, loss)
    assert model.get_submodule(name).source_layer is model.get_submodule(shared[name])
    with torch.no_grad():
        assert torch.equal(model(past_values=past).prediction_outputs, before)


def test_search_with_shared_layers_trains_saves_and_loads_the_shares(tmp_path):
    shared = second_layer_shares_first(dense_patchtst(layers=2))
    trainer = search_trainer(tmp_path / "run", config(shared, front_only=True), steps=40, layers=2)
    searched = {slot.name for slot in trainer.search.groups}
    assert not searched & set(shared)
    trainer.train()
    model = trainer.model.eval()
    assert any(form != Form("dense") for form in trainer.search.chosen.values())
    for name, source in shared.items():  # each share follows its source's current module, whatever form it took
        layer = model.get_submodule(name)
        assert isinstance(layer, SharedLinear) and layer.source_layer is model.get_submodule(source)
        assert model.config.compression_config["forms"][name] == {"method": "shared", "source": source}
    rows = linear_bytes(model)["modules"]
    assert all(rows[name]["disk"] == 0 for name in shared)
    stored = sum(rows[slot.name]["disk"] for slot in trainer.search.groups)
    assert stored <= sum(slot.dense_bytes for slot in trainer.search.groups) / 8
    assert not any(name.startswith(tuple(shared)) for name, _ in model.named_parameters())  # one set of weights
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        expected = model(past_values=past).prediction_outputs
    model.save_pretrained(tmp_path / "saved")
    loaded = load_model(tmp_path / "saved").eval()
    assert all(isinstance(loaded.get_submodule(name), SharedLinear) for name in shared)
    with torch.no_grad():
        assert torch.allclose(loaded(past_values=past).prediction_outputs, expected, atol=1e-5)
    torch.save({"past": past, "expected": expected}, tmp_path / "io.pt")


@pytest.mark.slow
def test_a_shared_searched_model_loads_in_new_processes_natively_and_with_remote_code(tmp_path):
    test_search_with_shared_layers_trains_saves_and_loads_the_shares(tmp_path)
    assert_forecasts_in_new_processes(tmp_path)


@pytest.mark.slow
def test_a_search_with_shared_layers_resumes_where_it_stopped(tmp_path):
    """A checkpoint inside the search holds the shares' structure (no tensors of their own); the resumed run links
    them to their sources again and makes the same decisions on the same losses as an uninterrupted one."""
    from test_form_search import StopAt

    shared = second_layer_shares_first(dense_patchtst(layers=2))
    whole = search_trainer(tmp_path / "whole", config(shared), steps=20, layers=2)
    whole.train()
    first = search_trainer(tmp_path / "part", config(shared), steps=20, save_steps=8, layers=2)
    first.add_callback(StopAt(8))
    first.train()
    assert not first.search.done
    resumed = search_trainer(tmp_path / "part", config(shared), steps=20, save_steps=8, layers=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-8"))
    assert resumed.search.chosen == whole.search.chosen
    assert [r["metric"] for r in resumed.search.trace] == [r["metric"] for r in whole.search.trace]
    for name, source in shared.items():
        assert resumed.model.get_submodule(name).source_layer is resumed.model.get_submodule(source)


def test_greedy_forms_measure_through_the_shares_and_keep_them():
    """``greedy_forms`` with ``shared``: measured on the dense model trained with the shares (refused on one without
    them, which would measure one use), its result keeps the shares and builds a fresh model within the budget."""
    from hf_tensorcompress import CompressionConfig, apply_compression
    from hf_tensorcompress.search import greedy_forms

    model = dense_patchtst(layers=2).eval()
    shared = second_layer_shares_first(model)
    search = config(shared)
    past, future = sines(200, seed=3)[0]["past_values"][None], sines(200, seed=3)[0]["future_values"][None]

    def loss(m):
        with torch.no_grad():
            return float((m(past_values=past).prediction_outputs - future).square().mean())

    with pytest.raises(ValueError, match="does not share it: measure on the model trained with the shares"):
        greedy_forms(model, search, loss)
    forms = {name: {"method": "shared", "source": source} for name, source in shared.items()}
    trained = apply_compression(model, CompressionConfig(method="mixed", forms=forms))
    allocated = greedy_forms(trained, search, loss)
    assert {n: f for n, f in allocated.forms.items() if f["method"] == "shared"} == forms
    fresh = apply_compression(dense_patchtst(layers=2), allocated)
    rows = linear_bytes(fresh)["modules"]
    slots = linear_slots(dense_patchtst(layers=2), search)
    assert sum(rows[slot.name]["disk"] for slot in slots) <= sum(slot.dense_bytes for slot in slots) / 8
    assert all(rows[name]["disk"] == 0 for name in shared)
