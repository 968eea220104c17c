"""``SearchConfig.reward_baseline="same_weights"``: an action's reward compares its Linear's new form with the previous
one rebuilt from the same weights a stage later, each side's bytes priced at the greedy allocation's marginal loss per
byte, instead of comparing the loss with the stage before the action."""

from __future__ import annotations

import pytest
from smartformer_fixtures import dense_patchtst, search_trainer

from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import allocation_bytes, greedy_allocation, greedy_with_price
from hf_tensorcompress.search.forms import Form, linear_slots
from hf_tensorcompress.search.mdp import RankSearch
from hf_tensorcompress.search.reward import loss_reward
from hf_tensorcompress.search.trainer import SmartformerTrainer

FORMS = dict(forms=("dense", "lowbit"), factor_widths=(8, 4, 2, "ternary"), weight_group_sizes=(16,))


def config(**overrides) -> SearchConfig:
    options = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=1 / 4, **FORMS)
    options.update(reward="validation_loss", reward_baseline="same_weights", share_by="sensitivity")
    return SearchConfig(**{**options, **overrides})


def measured(slots):
    """Each Linear loses in proportion to the bytes a form saves, the last one a hundred times more."""

    def measure(name: str) -> dict[Form, float]:
        slot = next(slot for slot in slots if slot.name == name)
        scale = 1.0 if name == slots[-1].name else 0.01
        return {form: scale * (1 - slot.bytes_at(form) / slot.dense_bytes) for form in slot.actions}

    return measure


def fresh(search_config: SearchConfig) -> RankSearch:
    slots = linear_slots(dense_patchtst(layers=1), search_config)
    search = RankSearch(slots, {}, search_config, chosen={slot.name: Form("dense") for slot in slots})
    search.measure = measured(slots)
    return search


def test_config_refuses_a_same_weights_baseline_without_what_it_needs():
    with pytest.raises(ValueError, match=r"reward_baseline='now': one of \['previous_stage', 'same_weights'\]"):
        config(reward_baseline="now")
    with pytest.raises(ValueError, match="pass reward='validation_loss' and byte_budget=... \\(got reward='loss'"):
        config(reward="loss")
    with pytest.raises(ValueError, match="byte_budget=None"):
        config(byte_budget=None, share_by="fp32_bytes")
    with pytest.raises(ValueError, match="reward_baseline='same_weights': options of the search over forms; pass"):
        SearchConfig(reward="validation_loss", reward_baseline="same_weights")
    assert SearchConfig.from_dict(config().to_dict()).reward_baseline == "same_weights"


def test_the_byte_price_is_the_last_greedy_move_and_the_allocation_unchanged():
    search_config = config()
    slots = linear_slots(dense_patchtst(layers=1), search_config)
    losses = {slot.name: measured(slots)(slot.name) for slot in slots}
    total = sum(slot.dense_bytes for slot in slots)
    allocation, price = greedy_with_price(slots, total / 4, losses)
    assert allocation == greedy_allocation(slots, total / 4, losses)
    assert allocation_bytes(slots, allocation) <= total / 4
    # each Linear loses in proportion to the bytes it saves, at its own rate: greedy moves the cheapest rates first
    # and the price is the dearest rate it had to pay; the Linears it left dense cost more per byte
    rates = {slot.name: (1.0 if slot is slots[-1] else 0.01) / slot.dense_bytes for slot in slots}
    moved = [slot.name for slot in slots if allocation[slot.name] != Form("dense")]
    assert moved and len(moved) < len(slots)
    assert price == pytest.approx(max(rates[name] for name in moved))
    assert all(rates[slot.name] >= price for slot in slots if slot.name not in moved)
    assert greedy_with_price(slots, total, losses) == ({s.name: Form("dense") for s in slots}, 0.0)


def test_the_reward_compares_both_forms_at_the_same_weights_with_bytes_priced():
    """The stage before the action no longer enters the reward: a stage's metric against the baseline the trainer
    measured for the previous form, each plus its bytes at the byte price; where the form did not change, both sides
    are that stage's metric at the same bytes."""
    search = fresh(config())
    first = search.end_stage(0, 5.0)  # measures, prices, acts; 5.0 never enters a reward
    price = search.byte_price
    assert first["byte_price"] == price and price > 0
    changed = 0
    for stage in range(1, 100):
        if search.done:
            break
        group = search.by_name[search.pending["group"]]
        previous, new = group.parse(search.pending["previous"]), group.actions[search.pending["action"]]
        baseline = None if previous == new else 0.2
        changed += baseline is not None
        record = search.end_stage(stage, 0.3, baseline=baseline)
        before = 0.3 if baseline is None else baseline
        expected = loss_reward(before + price * group.cost(previous, True), 0.3 + price * group.cost(new, True), 1.125)
        assert record["reward"] == pytest.approx(expected) and record["baseline_metric"] == before
        if baseline is None:
            assert record["reward"] == pytest.approx(1.0)
    assert search.done and changed


def test_the_price_survives_a_save_and_load(tmp_path):
    first = fresh(config())
    for stage in range(3):
        first.end_stage(stage, 1.0)
    first.save(str(tmp_path))
    resumed = fresh(config())
    resumed.measure = None  # a resumed search must not measure again
    resumed.load(str(tmp_path))
    assert resumed.byte_price == first.byte_price is not None
    assert resumed.pending == first.pending and "previous" in resumed.pending
    resumed.end_stage(3, 1.0, baseline=1.0)


def test_a_trained_search_scores_each_previous_form_and_needs_validation_batches(tmp_path):
    """In training the trainer rebuilds every changed Linear's previous form from its weights a stage later, scores
    it and puts the trained form back: the search ends within its budget and the model computes in its chosen
    forms."""
    search_config = config(front_only=True)
    trainer = search_trainer(tmp_path / "run", search_config, steps=60)
    trainer.train()
    search = trainer.search
    assert search.done and search.byte_price is not None
    rewarded = [record for record in search.trace if "reward" in record]
    assert rewarded and all("baseline_metric" in record for record in rewarded)
    changed = [record for record in rewarded if record["baseline_metric"] != record["metric"]]
    assert changed  # some previous forms were scored, and differ from the trained form's loss
    budget = search_config.byte_budget * sum(slot.dense_bytes for slot in search.groups)
    assert allocation_bytes(search.groups, search.chosen) <= budget
    for slot in search.groups:
        layer = trainer.model.get_submodule(slot.name)
        kind = getattr(layer, "layer_type", "dense")
        assert kind == search.chosen[slot.name].kind  # the scored previous forms were put back
    with pytest.raises(ValueError, match="scores each stage on held-out batches: pass eval_dataset"):
        SmartformerTrainer(model=dense_patchtst(layers=1), args=trainer.args, train_dataset=trainer.train_dataset,
                           search=config())  # fmt: skip
