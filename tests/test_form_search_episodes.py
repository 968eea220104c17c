"""``SearchConfig.episodes``: after the first pass decides every Linear, each later pass takes them up again, the
budget wall and the pace counting every other Linear in the form it holds."""

from __future__ import annotations

import logging

import pytest
from smartformer_fixtures import search_trainer
from test_form_search_greedy_start import MODULES
from test_form_search_shares import config, fresh

from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import allocation_bytes
from hf_tensorcompress.search.forms import Form
from hf_tensorcompress.search.space import allowed_actions
from hf_tensorcompress.search.trainer import unfinished_search


def metric(stage: int) -> float:
    """A stage metric that moves, so rewards differ and the agent's choices depend on what it learned."""
    return 1.0 + 0.1 * ((stage * 7) % 5)


def run_to_end(search, first: int = 0) -> list[dict]:
    records = []
    for stage in range(first, 2000):
        if search.done:
            return records
        records.append(search.end_stage(stage, metric(stage)))
    raise AssertionError("the search never finished")


def test_config_refuses_episodes_below_one_and_keeps_them_in_its_dict():
    for wrong in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"episodes must be an int >= 1, got {wrong!r}"):
            config(episodes=wrong)
    assert SearchConfig.from_dict(config(episodes=3).to_dict()).episodes == 3


@pytest.mark.parametrize("pace", [None, 0.5])
def test_every_pass_acts_on_every_linear_within_the_budget(pace):
    search = fresh(config(episodes=3, pace=pace, epsilon_start=1.0, epsilon_end=1.0))  # random actions: any form
    records = run_to_end(search)
    names = {slot.name for slot in search.groups}
    acted = {episode: {r["layer"] for r in records if "layer" in r and r["episode"] == episode} for episode in range(3)}
    assert acted == {0: names, 1: names, 2: names}
    starts = [r for r in records if "episode_start" in r]
    assert [r["episode_start"] for r in starts] == [1, 2]
    for start in starts:  # the stage that decided the last Linear of a pass also takes the next pass's first action
        assert "decided_layer" in start and "action" in start and start["decided"] == []
    assert search.episode == 2 and search.done
    for record in records[records.index(starts[0]) :]:  # from the first pass's end every Linear holds a chosen form
        assert allocation_bytes(search.groups, {n: Form.parse(f) for n, f in record["chosen"].items()}) <= (
            search.budget_bytes + 1e-6
        ), record["step"]


def test_a_later_pass_counts_the_others_in_the_forms_they_hold():
    """The first pass's wall counts undecided Linears at their cheapest form; a later pass would overspend that way,
    so it counts them as they are and offers only what the bytes left pay for."""
    search = fresh(config(episodes=2, pace=None))
    cheapest = {g.name: min(g.actions, key=lambda action, g=g: g.cost(action, True)) for g in search.groups}
    slack = search.budget_bytes - sum(g.cost(cheapest[g.name], True) for g in search.groups)
    wider = search.groups[1]  # a pass gave it half the slack; every other Linear holds its cheapest form
    fits = [a for a in wider.actions if wider.cost(a, True) <= wider.cost(cheapest[wider.name], True) + slack / 2]
    search.chosen = {**cheapest, wider.name: max(fits, key=lambda action: wider.cost(action, True))}
    search.episode = 1
    name = search.groups[0].name
    mask = search._mask(name)
    others = sum(g.cost(search.chosen[g.name], True) for g in search.groups if g.name != name)
    group = search.by_name[name]
    costs = {slot: group.cost(action, True) for slot, action in enumerate(group.actions)}
    allowed = [slot for slot, ok in enumerate(mask) if ok]
    assert allowed and all(others + costs[slot] <= search.budget_bytes for slot in allowed)
    first_pass = allowed_actions(search.groups, 0, search.chosen, set(), search.config.budget, search.width, True)
    assert sum(first_pass) > len(allowed)  # the first pass's wall would have offered more


def test_a_resumed_search_continues_its_pass_as_it_would_have(tmp_path):
    whole = fresh(config(episodes=2))
    records = run_to_end(whole)
    second = next(i for i, r in enumerate(records) if "episode_start" in r)
    cut = second + 2
    first = fresh(config(episodes=2))
    for stage in range(cut):
        first.end_stage(stage, metric(stage))
    first.save(str(tmp_path))
    resumed = fresh(config(episodes=2))
    resumed.load(str(tmp_path))
    assert resumed.episode == 1
    rest = run_to_end(resumed, first=cut)
    assert rest == records[cut:]  # the same draws, updates and forms
    assert resumed.chosen == whole.chosen


def test_a_trained_search_of_two_passes_leaves_its_last_forms_in_the_model(tmp_path):
    search_config = config(episodes=2, reward="validation_loss", front_only=True, warmup=4)
    trainer = search_trainer(tmp_path / "run", search_config, steps=200)
    trainer.train()
    search = trainer.search
    assert search.done and search.episode == 1
    assert {r["episode"] for r in search.trace if "layer" in r} == {0, 1}
    for name, form in search.chosen.items():
        assert type(trainer.model.get_submodule(name)) is MODULES[form.kind]
    assert allocation_bytes(search.groups, search.chosen) <= search.budget_bytes


def test_another_process_mirroring_the_records_follows_every_pass():
    """Under ``accelerate launch`` the other processes follow the main one's records: they must not see the search
    done at a pass's end, and they finish with the main process's forms."""
    main, follower = fresh(config(episodes=2)), fresh(config(episodes=2))
    for stage in range(2000):
        follower.mirror(main.end_stage(stage, metric(stage)))
        assert (follower.done, follower.episode, follower.chosen) == (main.done, main.episode, main.chosen)
        if main.done:
            break
    assert main.done and main.episode == 1


def test_a_run_ended_inside_a_later_pass_says_every_linear_holds_a_form_within_the_budget(tmp_path, caplog):
    """Ended in the first pass, undecided Linears are outside the budget's guarantee; ended in a later one, each
    holds a form an earlier pass gave it, which the wall kept within the budget: the warning says which."""
    search = fresh(config(episodes=2))
    search.end_stage(0, 1.0)
    assert "before the rank search decided" in unfinished_search(search)
    run_to_end(search)
    search.episode, search.decided = 1, {search.groups[0].name: 0}
    later = unfinished_search(search)
    assert "pass 2 of 2" in later and search.groups[0].name not in later and search.groups[1].name in later
    with caplog.at_level(logging.WARNING, logger="hf_tensorcompress.search.trainer"):
        trainer = search_trainer(tmp_path / "run", config(episodes=50, warmup=4), steps=120)  # 50 passes: too many
        trainer.train()
    assert 0 < trainer.search.episode < 49 and not trainer.search.done
    warned = [r.getMessage() for r in caplog.records if "training ended" in r.getMessage()]
    assert len(warned) == 1 and f"pass {trainer.search.episode + 1} of 50" in warned[0]
    assert allocation_bytes(trainer.search.groups, trainer.search.chosen) <= trainer.search.budget_bytes
