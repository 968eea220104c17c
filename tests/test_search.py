"""The search pieces on their own: config, action space, rewards, importance, encoder, agent, and the MDP."""

from __future__ import annotations

import random

import pytest
import torch
from smartformer_fixtures import tiny_patchtst
from transformers import PatchTSTConfig, PatchTSTForPrediction

from hf_tensorcompress.search import (
    RankSearch,
    SearchConfig,
    TaylorImportance,
    accuracy_reward,
    attention_groups,
    candidate_ranks,
    loss_reward,
)
from hf_tensorcompress.search.space import allowed_actions


# ---------------------------------------------------------------- config
def test_config_json_round_trip_and_paper_tolerances(tmp_path):
    config = SearchConfig(interval=3, interval_unit="epochs", param_budget=0.6, seed=7)
    path = tmp_path / "search.json"
    config.to_json_file(str(path))
    assert SearchConfig.from_json_file(str(path)) == config
    assert SearchConfig().tolerance == 1.125
    assert SearchConfig(reward="accuracy").tolerance == 0.1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"interval": 0}, "interval must be an int >= 1"),
        ({"interval_unit": "minutes"}, "choose one of ['steps', 'epochs']"),
        ({"reward": "mse"}, "choose 'loss'"),
        ({"tolerance": 0.9}, "must be >= 1"),
        ({"epsilon_start": 0.1, "epsilon_end": 0.2}, "ε only decays"),
        ({"consecutive_actions": 5, "max_actions_per_layer": 3}, "no layer could ever converge"),
        ({"param_budget": 1.5}, "fraction in (0, 1]"),
    ],
)
def test_config_rejects_bad_values_with_a_hint(kwargs, message):
    with pytest.raises(ValueError) as error:
        SearchConfig(**kwargs)
    assert message in str(error.value)


def test_from_dict_names_unknown_fields():
    with pytest.raises(ValueError, match="unknown SearchConfig field"):
        SearchConfig.from_dict({"intervall": 3})


def test_epsilon_decays_to_its_floor():
    config = SearchConfig(epsilon_start=0.5, epsilon_end=0.1, epsilon_decay=0.5)
    assert [config.epsilon(t) for t in range(4)] == [0.5, 0.25, 0.125, 0.1]


# ---------------------------------------------------------------- action space
def test_candidate_ranks_follow_design_3_1():
    assert candidate_ranks(dense_weights=60, params_per_rank=10, max_candidates=10) == (1, 2, 3, 4, 5, 6)
    assert candidate_ranks(dense_weights=1000, params_per_rank=10, max_candidates=10) == tuple(range(10, 101, 10))


def test_attention_groups_share_one_rank_per_attention_module():
    model = tiny_patchtst(layers=3)
    groups = attention_groups(model)
    assert [g.name for g in groups] == [f"model.encoder.layers.{i}.self_attn" for i in range(3)]
    assert all(g.modules == tuple(f"{g.name}.{p}" for p in ("q_proj", "k_proj", "v_proj")) for g in groups)
    # d_model 16, 4 heads: a rank costs 3·(4 + 4 + 16) parameters against 3·256 dense -> ranks 1..10
    assert groups[0].heads == 4 and groups[0].head_dim == 4 and groups[0].candidates == tuple(range(1, 11))


def test_attention_groups_need_a_compressed_model():
    torch.manual_seed(0)
    dense = PatchTSTForPrediction(
        PatchTSTConfig(num_input_channels=2, context_length=16, patch_length=4, patch_stride=4, d_model=8)
    )
    with pytest.raises(ValueError, match="apply_compression"):
        attention_groups(dense)


def test_budget_wall_keeps_the_final_budget_reachable():
    groups = attention_groups(tiny_patchtst(layers=2))
    names = [g.name for g in groups]
    ranks = {name: (10, None) for name in names}
    # budget 0.5 of 2 × (768 weights + 48 biases) = 816; a rank costs 72, the other group needs >= 72 + 48 (rank 1)
    assert groups[0].params_at(1) == 72 + 48 and groups[0].dense_params == 816
    mask = allowed_actions(groups, 0, ranks, set(), 0.5, 10)
    assert mask == [rank * 72 + 48 + 120 <= 816 for rank in range(1, 11)] and sum(mask) == 9
    # once the other group is decided at rank 6 (480), this one may take at most 4 (336)
    mask = allowed_actions(groups, 0, {names[0]: (10, None), names[1]: (6, None)}, {names[1]}, 0.5, 10)
    assert [slot + 1 for slot, ok in enumerate(mask) if ok] == [1, 2, 3, 4]


# ---------------------------------------------------------------- rewards
def test_loss_reward_is_paper_eq_14():
    assert loss_reward(1.0, 0.8, 1.125) == pytest.approx(1.25)
    assert loss_reward(1.0, 1.1, 1.125) == pytest.approx(1 / 1.1)  # within tolerance: still positive
    assert loss_reward(1.0, 1.2, 1.125) == pytest.approx(-1.2)


def test_accuracy_reward_is_paper_eq_13():
    assert accuracy_reward(0.5, 0.6, 0.1) == pytest.approx(1.2)
    assert accuracy_reward(0.6, 0.55, 0.1) == pytest.approx(0.55 / 0.6)
    assert accuracy_reward(0.6, 0.4, 0.1) == pytest.approx(-1.5)


# ---------------------------------------------------------------- importance
def test_taylor_importance_is_sum_of_squared_grad_times_param():
    model = tiny_patchtst()
    groups = attention_groups(model)
    batch = {"past_values": torch.randn(4, 32, 3), "future_values": torch.randn(4, 8, 3)}
    model(**batch).loss.backward()
    importance = TaylorImportance(groups)
    importance.accumulate(model)
    importance.accumulate(model)
    for group in groups:
        expected = sum(
            float((p.grad * p.detach()).square().sum())
            for name in group.modules
            for p in model.get_submodule(name).factors
        )
        assert importance.scores[group.name] == pytest.approx(2 * expected, rel=1e-5)
    importance.reset()
    assert set(importance.scores.values()) == {0.0}


# ---------------------------------------------------------------- encoder and agent
def _search(model, **kwargs) -> RankSearch:
    groups = attention_groups(model)
    ranks = {g.name: model.get_submodule(g.modules[0]).rank for g in groups}
    return RankSearch(groups, ranks, SearchConfig(**kwargs))


def test_encoder_is_small_and_sees_the_ranks():
    search = _search(tiny_patchtst())
    encoder = search.agent.encoder
    assert sum(p.numel() for p in encoder.parameters()) < 100_000
    before = encoder(search._tokens(), 0)
    search.chosen[search.groups[1].name] = (3, None)  # another layer's rank changes the selected layer's state (biLSTM)
    assert before.shape == (128,) and not torch.allclose(before, encoder(search._tokens(), 0))


def test_actor_critic_update_follows_the_advantage():
    search = _search(tiny_patchtst())
    agent, tokens, mask = search.agent, search._tokens(), [True] * 10
    state = (tokens, 0)

    def prob(action):
        with torch.no_grad():
            return torch.softmax(agent.actor(agent.encoder(*state)), -1)[action].item()

    before = prob(3)
    stats = agent.update(state, 3, mask, reward=5.0, next_state=state)
    assert stats["advantage"] > 0 and prob(3) > before
    before = prob(3)
    stats = agent.update(state, 3, mask, reward=-50.0, next_state=state)
    assert stats["advantage"] < 0 and prob(3) < before


def test_exploration_uses_a_uniform_draw():
    search = _search(tiny_patchtst())
    rng = random.Random(0)
    explored = [search.agent.act(search._tokens(), 0, [True] * 10, 0.3, rng)[1] for _ in range(800)]
    assert abs(sum(explored) / 800 - 0.3) < 0.07  # ~4.5 sigma; randn < 0.3 would explore ~62% of the time


def test_the_sampling_policy_draws_from_pi_within_the_mask():
    search = _search(tiny_patchtst())
    agent, tokens, rng = search.agent, search._tokens(), random.Random(0)
    mask = [slot % 3 != 0 for slot in range(10)]
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.linspace(-1.0, 1.0, 10))  # a π far from uniform
        pi = torch.softmax(agent.actor(agent.encoder(tokens, 0)).masked_fill(~torch.tensor(mask), -torch.inf), -1)
    draws = [agent.act(tokens, 0, mask, 0.0, rng, sample=True) for _ in range(3000)]
    assert not any(explored for _, explored in draws)
    counts = torch.bincount(torch.tensor([slot for slot, _ in draws]), minlength=10).float() / 3000
    assert counts[[0, 3, 6, 9]].sum() == 0  # masked slots never drawn
    assert torch.allclose(counts, pi, atol=0.04)  # 0.04: > 4 sigma of a frequency from 3000 draws
    assert {agent.act(tokens, 0, mask, 0.0, rng)[0] for _ in range(50)} == {int(pi.argmax())}  # argmax: always it


def test_replay_lets_one_bad_reward_turn_the_actor_where_one_step_does_not():
    """The paper's one A2C step moves the actor by about the learning rate, whatever the reward: its argmax stays.
    Replaying the transitions (``replay_epochs``) refits on them until a reward below the critic's value has turned
    the actor away from that action."""
    turned = {}
    for epochs in (0, 20):
        search = _search(tiny_patchtst())
        agent, tokens, mask = search.agent, search._tokens(), [True] * 10
        first = agent.act(tokens, 0, mask, 0.0, random.Random(0))[0]
        transition = {"tokens": tokens, "position": 0, "action": first, "mask": mask, "reward": 0.5}
        transition["next_tokens"] = tokens  # a reward of 0.5: the loss doubled after the action
        agent.update((tokens, 0), first, mask, 0.5, (tokens, 0))
        if epochs:
            agent.replay([transition], epochs)
        turned[epochs] = agent.act(tokens, 0, mask, 0.0, random.Random(0))[0] != first
    assert turned == {0: False, 20: True}


def test_config_refuses_a_negative_or_fractional_replay():
    for wrong in (-1, 1.5, True):
        with pytest.raises(ValueError, match="replay_epochs must be an int >= 0"):
            SearchConfig(replay_epochs=wrong)


def test_config_refuses_an_unknown_policy():
    with pytest.raises(ValueError, match=r"policy='softmax': one of \['argmax', 'sample'\]"):
        SearchConfig(policy="softmax")


# ---------------------------------------------------------------- the MDP
def _run(search: RankSearch, importance: dict[str, float], stages: int, start: int = 0) -> None:
    for stage in range(start, stages):
        if search.done:
            return
        search.importance.scores = dict(importance)
        search.end_stage(step=stage, metric=1.0 / (1 + stage))


def test_mdp_goes_least_important_first_and_stops_after_k_equal_actions():
    model = tiny_patchtst(layers=3)
    search = _search(model, epsilon_start=0.0, epsilon_end=0.0, consecutive_actions=3)
    names = [g.name for g in search.groups]
    importance = {names[0]: 3.0, names[1]: 1.0, names[2]: 2.0}
    _run(search, importance, 30)
    chosen = [record["layer"] for record in search.trace if "layer" in record]
    # greedy actions repeat, so each layer is decided after exactly k = 3 actions, least important first
    assert chosen == [names[1]] * 3 + [names[2]] * 3 + [names[0]] * 3
    assert search.done and [r.get("decided_layer") for r in search.trace if r.get("decided_layer")] == [
        names[1],
        names[2],
        names[0],
    ]
    assert all(len(search.actions[name]) == 3 for name in names)


def test_a_sampling_search_tries_several_actions_a_layer_and_still_decides_every_layer_at_the_cap():
    """With ``policy="sample"`` k agreeing actions are no longer what the untrained actor gives: layers whose draws do
    not agree are decided at ``max_actions_per_layer`` by the actor's most probable action."""
    model = tiny_patchtst(layers=3)
    options = dict(epsilon_start=0.0, epsilon_end=0.0, consecutive_actions=3, max_actions_per_layer=6)
    sampled = _search(model, policy="sample", **options)
    greedy = _search(model, **options)
    for search in (sampled, greedy):
        _run(search, {g.name: float(g.position) for g in search.groups}, 100)
        assert search.done
    assert {len(set(actions)) for actions in greedy.actions.values()} == {1}
    assert max(len(set(actions)) for actions in sampled.actions.values()) > 1
    assert max(len(actions) for actions in sampled.actions.values()) == 6


def test_mdp_respects_the_parameter_budget_and_always_ends():
    model = tiny_patchtst(layers=3)
    search = _search(
        model, epsilon_start=1.0, epsilon_end=1.0, consecutive_actions=5, max_actions_per_layer=6, param_budget=0.4
    )
    _run(search, {g.name: float(g.position) for g in search.groups}, 100)
    assert search.done
    used = sum(g.params_at(search.ranks[g.name]) for g in search.groups)
    assert used <= 0.4 * sum(g.dense_params for g in search.groups)
    assert max(len(a) for a in search.actions.values()) <= 6


def test_the_rank_search_in_two_passes_acts_on_every_layer_again_within_the_parameter_budget():
    """``episodes`` applies to the rank search too: the second pass takes every attention layer up again, and from the
    first pass's end on the ranks fit ``param_budget`` after every action (the wall counts the others as they are)."""
    model = tiny_patchtst(layers=3)
    search = _search(
        model, epsilon_start=1.0, epsilon_end=1.0, consecutive_actions=2, max_actions_per_layer=3, param_budget=0.4,
        episodes=2,
    )  # fmt: skip
    _run(search, {g.name: float(g.position) for g in search.groups}, 200)
    assert search.done and search.episode == 1
    names = {g.name for g in search.groups}
    for episode in (0, 1):
        assert {r["layer"] for r in search.trace if "layer" in r and r["episode"] == episode} == names
    dense = sum(g.dense_params for g in search.groups)
    start = next(i for i, r in enumerate(search.trace) if "episode_start" in r)
    for record in search.trace[start:]:
        assert sum(g.params_at(record["ranks"][g.name]) for g in search.groups) <= 0.4 * dense


def test_mdp_state_dict_round_trip_continues_identically():
    model = tiny_patchtst(layers=3)
    kwargs = dict(epsilon_start=0.6, consecutive_actions=3, seed=3)
    importance = {f"model.encoder.layers.{i}.self_attn": float(i) for i in range(3)}
    reference = _search(model, **kwargs)
    _run(reference, importance, 40)

    interrupted = _search(model, **kwargs)
    _run(interrupted, importance, 5)
    state = interrupted.state_dict()
    agent_state = interrupted.agent.full_state_dict()
    resumed = _search(model, **kwargs)
    resumed.load_state_dict(state)
    resumed.agent.load_full_state_dict(agent_state)
    _run(resumed, importance, 40, start=5)
    assert resumed.trace == reference.trace and resumed.ranks == reference.ranks
