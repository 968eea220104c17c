"""``SearchConfig.share_by="sensitivity"``: the pace shares the bytes left by each Linear's bytes in the greedy
allocation by measured sensitivity, measured once for every Linear when the agent first acts."""

from __future__ import annotations

import pytest
from smartformer_fixtures import dense_patchtst, search_trainer

from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import allocation_bytes, greedy_allocation
from hf_tensorcompress.search.forms import Form, linear_slots
from hf_tensorcompress.search.mdp import RankSearch
from hf_tensorcompress.search.trainer import SmartformerTrainer

FORMS = dict(forms=("dense", "lowbit", "svd"), factor_widths=(8, 4, 2, "ternary"), weight_group_sizes=(16,))


def config(**overrides) -> SearchConfig:
    options = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=1 / 8, **FORMS)
    return SearchConfig(**{**options, **overrides})


class Measured:
    """A stand-in for the trainer's measurement: the last Linear loses much in every cheaper form, the others
    little; counts the Linears it measured."""

    def __init__(self, slots) -> None:
        self.slots = {slot.name: slot for slot in slots}
        self.sensitive = slots[-1].name
        self.calls: list[str] = []

    def __call__(self, name: str) -> dict[Form, float]:
        self.calls.append(name)
        slot = self.slots[name]
        scale = 1e3 if name == self.sensitive else 1e-3
        return {form: scale * (1 - slot.bytes_at(form) / slot.dense_bytes) for form in slot.actions}


def fresh(search_config: SearchConfig) -> RankSearch:
    """A search over the tiny PatchTST's Linears, every one dense, measured by ``Measured``."""
    slots = linear_slots(dense_patchtst(layers=1), search_config)
    search = RankSearch(slots, {}, search_config, chosen={slot.name: Form("dense") for slot in slots})
    search.measure = Measured(slots)
    return search


def run(search_config: SearchConfig) -> tuple[RankSearch, Measured]:
    search = fresh(search_config)
    for stage in range(500):
        search.end_stage(stage, 1.0)
        if search.done:
            break
    assert search.done
    return search, search.measure


def test_config_refuses_share_by_without_what_it_shares():
    with pytest.raises(ValueError, match=r"share_by='size': one of \['fp32_bytes', 'sensitivity'\]"):
        config(share_by="size")
    with pytest.raises(ValueError, match="share_by='sensitivity' .* pass byte_budget=... and a pace"):
        config(share_by="sensitivity", pace=None)
    with pytest.raises(ValueError, match="share_by='sensitivity': options of the search over forms; pass forms"):
        SearchConfig(share_by="sensitivity")
    assert SearchConfig.from_dict(config(share_by="sensitivity").to_dict()).share_by == "sensitivity"


@pytest.mark.parametrize("front_only", [False, True])
def test_shares_follow_the_greedy_allocation_measured_once(front_only):
    """Every Linear is measured once, at the first action; its weight in the shares is its bytes in the greedy
    allocation by those losses, and every action's share is the bytes left split by those weights over the
    undecided Linears (with ``front_only``: each front from the same measurements)."""
    search, measured = run(config(share_by="sensitivity", front_only=front_only))
    names = [slot.name for slot in search.groups]
    assert sorted(measured.calls) == sorted(names)  # once each
    losses = {name: measured(name) for name in names}
    budget = search.config.byte_budget * sum(slot.dense_bytes for slot in search.groups)
    greedy = greedy_allocation(search.groups, budget, losses)
    expected = {slot.name: slot.cost(greedy[slot.name], True) for slot in search.groups}
    assert search.trace[0]["sensitivity_shares"] == pytest.approx(expected)
    assert search.share_weights == pytest.approx(expected)
    assert set(search.front) == (set(names) if front_only else set())
    for record in filter(lambda record: "action" in record, search.trace):  # decided Linears keep their forms
        decided = [(name, search.by_name[name].parse(record["chosen"][name])) for name in record["decided"]]
        spent = sum(search.by_name[name].cost(form, True) for name, form in decided)
        left = sum(expected[name] for name in names if name not in record["decided"])
        assert record["share"] == pytest.approx((budget - spent) * expected[record["layer"]] / left)
    assert allocation_bytes(search.groups, search.chosen) <= budget


def test_a_sensitive_linear_keeps_more_bytes_when_shares_follow_sensitivity():
    """Shared by fp32 bytes, the sensitive Linear's share is its size's part of the budget, and the pace holds it
    near that; shared by sensitivity it gets the bytes greedy gives it, and keeps more of them."""
    kept = {}
    for share_by in ("fp32_bytes", "sensitivity"):
        search, measured = run(config(share_by=share_by, pace=0.25))
        slot = search.by_name[measured.sensitive]
        kept[share_by] = slot.cost(search.chosen[slot.name], True)
        assert len(measured.calls) == (0 if share_by == "fp32_bytes" else len(search.groups))
    assert kept["sensitivity"] > kept["fp32_bytes"]


def test_the_shares_survive_a_save_and_load_without_measuring_again(tmp_path):
    search_config = config(share_by="sensitivity")
    first = fresh(search_config)
    for stage in range(3):
        first.end_stage(stage, 1.0)
    first.save(str(tmp_path))
    resumed = fresh(search_config)
    resumed.load(str(tmp_path))
    assert resumed.share_weights == first.share_weights and resumed.share_weights
    resumed.end_stage(3, 1.0)
    assert resumed.measure.calls == []


def test_a_trained_search_shares_by_sensitivity_and_needs_validation_batches(tmp_path):
    search_config = config(share_by="sensitivity", reward="validation_loss", front_only=True)
    trainer = search_trainer(tmp_path / "run", search_config, steps=60)
    trainer.train()
    search = trainer.search
    assert search.done and set(search.share_weights) == {slot.name for slot in search.groups}
    assert set(search.front) == set(search.share_weights)
    budget = search_config.byte_budget * sum(slot.dense_bytes for slot in search.groups)
    assert allocation_bytes(search.groups, search.chosen) <= budget
    with pytest.raises(ValueError, match="share_by='sensitivity'.* scores each form on eval_dataset; pass one"):
        SmartformerTrainer(model=dense_patchtst(layers=1), args=trainer.args, train_dataset=trainer.train_dataset,
                           search=config(share_by="sensitivity"))  # fmt: skip
