"""``SearchConfig.start="greedy"``: at the first stage end every Linear moves to the greedy allocation by its measured
sensitivity, and the agent refines that allocation from the next stage on."""

from __future__ import annotations

import pytest
import torch
from smartformer_fixtures import dense_patchtst, search_trainer
from test_form_search_shares import Measured, config, fresh

from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from hf_tensorcompress.methods.svd.layer import LowRankLinear
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import allocation_bytes, greedy_allocation
from hf_tensorcompress.search.forms import Form
from hf_tensorcompress.search.trainer import SmartformerTrainer

MODULES = {"dense": torch.nn.Linear, "lowbit": LowBitLinear, "svd": LowRankLinear}


def expected_greedy(search) -> dict[str, Form]:
    """The greedy allocation of ``search``'s byte budget by ``Measured``'s losses."""
    losses = {slot.name: Measured(search.groups)(slot.name) for slot in search.groups}
    return greedy_allocation(search.groups, search.budget_bytes, losses)


def test_config_refuses_a_greedy_start_without_a_byte_budget_or_forms():
    with pytest.raises(ValueError, match="start='greedy' allocates byte_budget greedily .* pass byte_budget"):
        config(start="greedy", byte_budget=None, pace=None)
    with pytest.raises(ValueError, match="start='greedy': options of the search over forms; pass forms"):
        SearchConfig(start="greedy")
    with pytest.raises(ValueError, match="'dense' \\(the model as given\\) or 'greedy'"):
        config(start="greediest")
    assert SearchConfig.from_dict(config(start="greedy").to_dict()).start == "greedy"


@pytest.mark.parametrize("share_by", ["fp32_bytes", "sensitivity"])
def test_the_first_stage_moves_every_linear_to_greedy_and_the_agent_acts_at_the_next(share_by):
    """The first stage end measures every Linear once (shares by sensitivity read the same measurements), changes
    every Linear greedy does not leave dense, and takes no action, so the first reward is measured against greedy's
    forms; the search then decides every Linear within the budget."""
    search = fresh(config(start="greedy", share_by=share_by))
    greedy = expected_greedy(search)
    first = search.end_stage(0, 1.0)
    names = [slot.name for slot in search.groups]
    assert sorted(search.measure.calls) == sorted(names)
    assert search.chosen == greedy and search.pending is None and "action" not in first
    assert first["greedy_start"] == {name: search.by_name[name].dump(greedy[name]) for name in names}
    assert first["form_changes"] == {
        name: search.by_name[name].dump(form) for name, form in greedy.items() if form != Form("dense")
    }
    assert len(set(greedy.values())) > 1  # the sensitive Linear kept more bytes: the test can tell forms apart
    second = search.end_stage(1, 1.0)
    assert "action" in second and "reward" not in second and second["layer"] in names
    assert ("sensitivity_shares" in first) == (share_by == "sensitivity")
    for stage in range(2, 500):
        if search.done:
            break
        search.end_stage(stage, 1.0)
    assert search.done and len(search.measure.calls) == len(names)
    assert allocation_bytes(search.groups, search.chosen) <= search.budget_bytes


def test_a_resumed_search_keeps_its_greedy_start_without_measuring_again(tmp_path):
    first = fresh(config(start="greedy"))
    first.end_stage(0, 1.0)
    first.end_stage(1, 1.0)
    first.save(str(tmp_path))
    resumed = fresh(config(start="greedy"))
    resumed.load(str(tmp_path))
    assert resumed.greedy == first.greedy and resumed.chosen == first.chosen
    record = resumed.end_stage(2, 1.0)
    assert resumed.measure.calls == [] and "greedy_start" not in record and "reward" in record


def test_a_trained_search_starts_from_greedy_in_the_model_and_needs_validation_batches(tmp_path):
    """In a ``SmartformerTrainer`` the Linears train dense until the first stage and then in greedy's forms, built in
    the model; the search's last form of every Linear is what the model holds."""
    search_config = config(start="greedy", reward="validation_loss", front_only=True, warmup=4)
    trainer = search_trainer(tmp_path / "run", search_config, steps=7)  # one stage: the greedy start
    trainer.train()
    search = trainer.search
    start = search.trace[0]["greedy_start"]
    assert (
        len(search.trace) == 1
        and search.trace[0]["step"] == 6
        and search.chosen == {name: search.by_name[name].parse(form) for name, form in start.items()}
    )
    assert {Form.parse(form).kind for form in start.values()} - {"dense"}  # something moved
    for name, form in start.items():
        assert type(trainer.model.get_submodule(name)) is MODULES[Form.parse(form).kind]
    assert allocation_bytes(search.groups, search.chosen) <= search.budget_bytes
    with pytest.raises(ValueError, match="start='greedy'.* scores each form on eval_dataset; pass one"):
        SmartformerTrainer(model=dense_patchtst(layers=1), args=trainer.args, train_dataset=trainer.train_dataset,
                           search=config(start="greedy"))  # fmt: skip
