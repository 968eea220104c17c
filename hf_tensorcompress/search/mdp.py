"""The MDP of Algorithm 1 as a state machine driven by the trainer at the end of every stage.

Per stage the trainer feeds the training loss (or accuracy) and the Taylor importance; ``end_stage`` then
  1. completes the pending transition (s_t, a_t): reward from the stage metric before and after a_t (with
     ``reward_baseline="same_weights"``: after a_t, against the previous form at the same weights), A2C update;
  2. marks the layer decided when its last k actions agree (or the safeguard cap is hit);
  3. selects the least important undecided layer (kept until it is decided) and chooses its next rank ε-greedily.
The stage that ends one layer's search also serves as the first stage of the next one (its loss was measured on
the current structure), which saves one stage per layer compared with restarting Algorithm 1's outer loop. With
``episodes`` > 1 the stage that decides the last layer starts the next pass over all of them, every other layer
counted in the form it holds.
Only the main process runs this; the trainer broadcasts the returned record.
"""

from __future__ import annotations

import json
import os
import random

import torch

from .agent import ActorCritic, masked_log_softmax
from .allocators import greedy_with_price
from .config import GREEDY_START, SearchConfig
from .encoder import StateEncoder, build_vocabulary
from .forms import pareto_front
from .importance import TaylorImportance
from .reward import REWARDS
from .space import AttentionGroup, Width, allowed_actions

STATE_FILE = "search_state.json"
AGENT_FILE = "search_agent.pt"


class RankSearch:
    """The search over ``groups``: attention groups choosing (rank, factor width), or, in the search over forms, one
    Linear each choosing a ``forms.Form``; a group describes, costs, saves and reads back its own actions
    (``describe``, ``cost``, ``dump``, ``parse``), so the MDP is the same for both. ``chosen`` holds every group's
    current action (default: ``ranks`` and ``bits`` as (rank, width) pairs)."""

    def __init__(
        self,
        groups: list[AttentionGroup],
        ranks: dict[str, int],
        config: SearchConfig,
        bits: dict[str, Width] | None = None,
        chosen: dict | None = None,
    ) -> None:
        self.groups = groups
        self.by_name = {group.name: group for group in groups}
        self.config = config
        if chosen is None:
            chosen = {group.name: (ranks[group.name], (bits or {}).get(group.name)) for group in groups}
        self.chosen = dict(chosen)
        self.width = max(len(group.actions) for group in groups)
        with torch.random.fork_rng():  # agent init must not disturb (or depend on) the training RNG
            torch.manual_seed(config.seed)
            vocabulary = build_vocabulary(groups, self.chosen)
            fields = len(groups[0].describe(self.chosen[groups[0].name]))
            encoder = StateEncoder(vocabulary, config.embedding_dim, config.lstm_units, fields)
            self.agent = ActorCritic(encoder, self.width, config.hidden_units, config.gamma, config.learning_rate)
        self.rng = random.Random(config.seed)
        self.importance = TaylorImportance(groups)
        self.decided: dict[str, int] = {}
        #: the pass over the layers now running (``config.episodes`` of them, from 0)
        self.episode = 0
        self.current: str | None = None
        self.actions: dict[str, list] = {group.name: [] for group in groups}
        self.pending: dict | None = None
        self.actions_taken = 0
        self.trace: list[dict] = []
        #: with ``replay_epochs``: every completed transition (the agent's state tokens before and after, action,
        #: mask, reward), which the agent is refitted on
        self.transitions: list[dict] = []
        self.metric_sum = 0.0
        self.metric_count = 0
        #: the search over forms with ``front_only``: each Linear's Pareto front (action indices), measured by
        #: ``measure(name) -> {action: loss increase}`` (set by the trainer) when the agent first acts on it
        self.front: dict[str, list[int]] = {}
        self.measure = None
        #: with ``pace``: each Linear's share of the bytes left when it last acted, and whether no form was within it
        self.shares: dict[str, tuple[float, bool]] = {}
        #: ``share_by="sensitivity"``: each Linear's bytes in the greedy allocation by measured sensitivity, which
        #: the bytes left are shared in proportion to (measured when the agent first acts)
        self.share_weights: dict[str, float] = {}
        #: the loss per byte of the greedy allocation's last move (``reward_baseline="same_weights"`` prices bytes at
        #: it), measured with the shares; ``None``: not measured yet
        self.byte_price: float | None = None
        #: ``start="greedy"``: the greedy allocation by measured sensitivity every Linear moved to (empty: not yet)
        self.greedy: dict = {}

    # ------------------------------------------------------------------ observation
    @property
    def done(self) -> bool:
        return len(self.decided) == len(self.groups)

    @property
    def ranks(self) -> dict[str, int]:
        """Every group's current rank (a full-rank form: the rank of its weight)."""
        return {group.name: group.rank_of(self.chosen[group.name]) for group in self.groups}

    @property
    def bits(self) -> dict[str, Width]:
        """Every group's current width (factors, or the weight of a full-rank low-bit form; ``None``: fp32)."""
        return {group.name: group.bits_of(self.chosen[group.name]) for group in self.groups}

    @property
    def budget_bytes(self) -> float:
        """The search over forms' byte budget: ``byte_budget`` of every searched Linear's fp32 bytes."""
        return self.config.byte_budget * sum(group.dense_bytes for group in self.groups)

    def _dumped(self) -> dict:
        return {group.name: group.dump(self.chosen[group.name]) for group in self.groups}

    def _tokens(self) -> list[list[int]]:
        encoder = self.agent.encoder
        return encoder.encode_tokens([group.describe(self.chosen[group.name]) for group in self.groups])

    def _fixed(self, name: str) -> set[str]:
        """The layers the budget wall and the pace count in the form they hold while ``name`` acts: the decided ones
        in the first pass; in a later pass, where every layer holds the form a pass gave it, all the others."""
        if self.episode == 0:
            return set(self.decided)
        return {group.name for group in self.groups if group.name != name}

    def _mask(self, name: str) -> list[bool]:
        index = self.by_name[name].position
        in_bytes = self.config.byte_budget is not None
        mask = allowed_actions(
            self.groups, index, self.chosen, self._fixed(name), self.config.budget, self.width, in_bytes
        )
        if name in self.front:  # pacing then chooses among the front's forms
            kept = set(self.front[name])
            fronted = [ok and slot in kept for slot, ok in enumerate(mask)]
            mask = fronted if any(fronted) else mask  # the wall allows none of the front: the wall's own choice
        if self.config.forms is not None and self.config.pace is not None and self.config.byte_budget is not None:
            mask = self._paced(name, mask)
        return mask

    def _paced(self, name: str, mask: list[bool]) -> list[bool]:
        """``mask`` narrowed to the forms that cost within ± ``pace`` of ``name``'s share of the bytes left (the
        allowed form closest to the share where none does)."""
        group = self.by_name[name]
        budget = self.budget_bytes
        fixed = self._fixed(name)
        spent = sum(self.by_name[other].cost(self.chosen[other], True) for other in fixed)
        weight = self.share_weights or {g.name: g.dense_bytes for g in self.groups}
        undecided = sum(weight[g.name] for g in self.groups if g.name not in fixed)
        share = (budget - spent) * weight[name] / undecided
        costs = [
            group.cost(group.actions[slot], True) if slot < len(group.actions) else 0.0 for slot in range(self.width)
        ]
        low, high = share * (1 - self.config.pace), share * (1 + self.config.pace)
        paced = [ok and low <= cost <= high for ok, cost in zip(mask, costs)]
        self.shares[name] = (share, not any(paced))
        if any(paced):
            return paced
        closest = min((slot for slot, ok in enumerate(mask) if ok), key=lambda slot: abs(costs[slot] - share))
        return [slot == closest for slot in range(self.width)]

    # ------------------------------------------------------------------ one stage
    def end_stage(self, step: int, metric: float, baseline: float | None = None) -> dict:
        """Advance the MDP by one stage; returns the record (``changes`` = {group: new rank}, ``bit_changes`` =
        {group: new factor bits}, ``form_changes`` = {Linear: its new form, dumped} to apply). ``baseline``: with
        ``reward_baseline="same_weights"``, the metric with the Linear last acted on put back in its previous form
        (``None`` where its form did not change)."""
        importance = self.importance.state_dict()
        record: dict = {
            "step": step,
            "metric": metric,
            "importance": importance,
            "changes": {},
            "bit_changes": {},
            "form_changes": {},
        }
        if self.pending is not None:
            self._complete_transition(record, metric, baseline)
        if self.done and self.episode + 1 < self.config.episodes:
            self._next_episode(record)
        if self.config.start == GREEDY_START and not self.greedy:
            self._start_greedy(record)
        elif not self.done:
            if self.current is None:
                undecided = [g for g in self.groups if g.name not in self.decided]
                self.current = min(undecided, key=lambda g: (importance[g.name], g.position)).name
            self._act(record, metric)
        record.update(
            ranks=self.ranks,
            bits=self.bits,
            chosen=self._dumped(),
            decided=sorted(self.decided),
            episode=self.episode,
            done=self.done,
        )
        self.trace.append(record)
        self.importance.reset()
        return record

    def _complete_transition(self, record: dict, metric: float, baseline: float | None) -> None:
        pending, self.pending = self.pending, None
        name = pending["group"]
        before, after = pending["metric"], metric
        if self.config.reward_baseline == "same_weights":
            before, after = self._priced(pending, metric, baseline)
            record.update(baseline_metric=metric if baseline is None else baseline, byte_price=self.byte_price)
        reward = REWARDS[self.config.reward](before, after, self.config.tolerance)
        position = self.by_name[name].position
        next_tokens = self._tokens()
        stats = self.agent.update(
            (pending["tokens"], position), pending["action"], pending["mask"], reward, (next_tokens, position)
        )
        if self.config.replay_epochs:  # kept only where replayed: the search's saved state carries them
            transition = {key: pending[key] for key in ("tokens", "action", "mask")}
            self.transitions.append({**transition, "position": position, "reward": reward, "next_tokens": next_tokens})
            stats["replay_loss"] = self.agent.replay(self.transitions, self.config.replay_epochs)
        record.update(reward=reward, rewarded_layer=name, **stats)
        history = self.actions[name]
        k = self.config.consecutive_actions
        if len(history) >= k and len(set(history[-k:])) == 1:
            self._decide(name, record)
        elif self.config.max_actions_per_layer is not None and len(history) >= self.config.max_actions_per_layer:
            mask = self._mask(name)
            with torch.no_grad():
                logits = self.agent.actor(self.agent.encoder(self._tokens(), position))
            action = self.by_name[name].actions[int(masked_log_softmax(logits, mask).argmax())]
            self._take(name, action, record)
            self._decide(name, record)

    def _priced(self, pending: dict, metric: float, baseline: float | None) -> tuple[float, float]:
        """The previous form's and the new form's metric at the same weights, each plus its bytes at the byte price
        (``baseline`` ``None``: the form did not change, both the same)."""
        group = self.by_name[pending["group"]]
        previous, new = group.parse(pending["previous"]), group.actions[pending["action"]]
        price = self.byte_price or 0.0
        before = metric if baseline is None else baseline
        return before + price * group.cost(previous, True), metric + price * group.cost(new, True)

    def _take(self, name: str, action, record: dict) -> None:
        """Set ``name`` to ``action``, noting in ``record`` what the trainer must change: an attention group's rank
        and factor bits, or a Linear's form."""
        group, before = self.by_name[name], self.chosen[name]
        self.chosen[name] = action
        if not isinstance(group, AttentionGroup):
            if action != before:
                record["form_changes"][name] = group.dump(action)
            return
        if action[0] != before[0]:
            record["changes"][name] = action[0]
        if action[1] != before[1] and group.widths != (None,):
            record["bit_changes"][name] = action[1]

    def _decide(self, name: str, record: dict) -> None:
        self.decided[name] = self.ranks[name]
        self.current = None
        record["decided_layer"] = name

    def _next_episode(self, record: dict) -> None:
        """Every layer is undecided again with no actions yet; each keeps its form until the agent acts on it."""
        self.episode += 1
        self.decided, self.current = {}, None
        self.actions = {group.name: [] for group in self.groups}
        record["episode_start"] = self.episode

    def _act(self, record: dict, metric: float) -> None:
        name = self.current
        group = self.by_name[name]
        priced = self.config.reward_baseline == "same_weights" and self.byte_price is None
        if priced or (self.config.share_by == "sensitivity" and not self.share_weights):
            self._measure_sensitivity(record)
        if self.config.front_only and name not in self.front:
            self.front[name] = pareto_front(group, self.measure(name))
        if name in self.front and not self.actions[name]:
            record["front"] = [group.dump(group.actions[slot]) for slot in self.front[name]]
        mask = self._mask(name)
        tokens = self._tokens()
        epsilon = self.config.epsilon(self.actions_taken)
        sample = self.config.policy == "sample"
        slot, explored = self.agent.act(tokens, group.position, mask, epsilon, self.rng, sample)
        action, previous = group.actions[slot], self.chosen[name]
        self.pending = {"group": name, "tokens": tokens, "action": slot, "mask": mask, "metric": metric}
        self.pending["previous"] = group.dump(previous)
        self.actions[name].append(action)
        self.actions_taken += 1
        record.update(
            layer=name,
            position=group.position,
            layer_importance=record["importance"][name],
            rank=group.rank_of(action),
            previous_rank=group.rank_of(previous),
            bits_chosen=group.bits_of(action),
            previous_bits=group.bits_of(previous),
            action=group.dump(action),
            explored=explored,
            epsilon=epsilon,
        )
        if name in self.shares:
            record.update(share=self.shares[name][0], closest=self.shares[name][1], cost=group.cost(action, True))
        self._take(name, action, record)

    def _measure_sensitivity(self, record: dict) -> dict:
        """Every Linear measured alone in each of its forms, and the greedy allocation by those losses within the
        byte budget, returned; with ``share_by="sensitivity"`` it gives each Linear its weight in the shares, with
        ``front_only`` its front; its last move's loss per byte is the byte price."""
        losses = {group.name: self.measure(group.name) for group in self.groups}
        allocation, self.byte_price = greedy_with_price(self.groups, self.budget_bytes, losses)
        record["byte_price"] = self.byte_price
        if self.config.share_by == "sensitivity":
            self.share_weights = {group.name: group.cost(allocation[group.name], True) for group in self.groups}
            record["sensitivity_shares"] = dict(self.share_weights)
        if self.config.front_only:
            for name, loss in losses.items():
                self.front.setdefault(name, pareto_front(self.by_name[name], loss))
        return allocation

    def _start_greedy(self, record: dict) -> None:
        """``start="greedy"``: every Linear moves to its form in the greedy allocation by measured sensitivity; the
        agent first acts at the next stage end, against the loss of these forms."""
        allocation = self._measure_sensitivity(record)
        for group in self.groups:
            self._take(group.name, allocation[group.name], record)
        self.greedy = self._dumped()
        record["greedy_start"] = dict(self.greedy)

    def observe(self, metric: float) -> None:
        self.metric_sum += float(metric)
        self.metric_count += 1

    def mirror(self, record: dict) -> None:
        """Follow the main process's decision on another process (actions and progress, not the agent)."""
        self.chosen = {name: self.by_name[name].parse(value) for name, value in record["chosen"].items()}
        ranks = self.ranks
        self.decided = {name: ranks[name] for name in record["decided"]}
        self.episode = int(record.get("episode", 0))
        self.trace.append(record)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "config": self.config.to_dict(),
            "vocabulary": self.agent.encoder.vocabulary,
            "ranks": self.ranks,
            "bits": self.bits,
            "chosen": self._dumped(),
            "decided": self.decided,
            "episode": self.episode,
            "current": self.current,
            "actions": {name: [self.by_name[name].dump(a) for a in values] for name, values in self.actions.items()},
            "pending": self.pending,
            "actions_taken": self.actions_taken,
            "trace": self.trace,
            "transitions": self.transitions,
            "importance": self.importance.state_dict(),
            "metric_sum": self.metric_sum,
            "metric_count": self.metric_count,
            "front": self.front,
            "share_weights": self.share_weights,
            "byte_price": self.byte_price,
            "greedy": self.greedy,
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["vocabulary"] != self.agent.encoder.vocabulary:
            raise ValueError(
                "the checkpoint's search state was made for different attention layers (its state vocabulary "
                "differs); resume with the same model and compression config"
            )
        if "chosen" in state:
            self.chosen = {name: self.by_name[name].parse(value) for name, value in state["chosen"].items()}
        else:  # written before the search over forms: ranks and bits
            bits = state.get("bits", {})
            self.chosen = {name: (int(rank), bits.get(name)) for name, rank in state["ranks"].items()}
        self.decided = {name: int(rank) for name, rank in state["decided"].items()}
        self.episode = int(state.get("episode", 0))
        self.current = state["current"]
        self.actions = {
            name: [self.by_name[name].parse(value) for value in values] for name, values in state["actions"].items()
        }
        self.pending = state["pending"]
        self.actions_taken = int(state["actions_taken"])
        self.trace = list(state["trace"])
        self.transitions = list(state.get("transitions", []))
        self.importance.load_state_dict(state["importance"])
        self.metric_sum, self.metric_count = float(state["metric_sum"]), int(state["metric_count"])
        self.front = {name: [int(slot) for slot in slots] for name, slots in state.get("front", {}).items()}
        self.share_weights = {name: float(weight) for name, weight in state.get("share_weights", {}).items()}
        self.greedy = dict(state.get("greedy", {}))
        self.byte_price = state.get("byte_price")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as handle:
            json.dump(self.state_dict(), handle)
        torch.save(self.agent.full_state_dict(), os.path.join(folder, AGENT_FILE))

    def load(self, folder: str) -> None:
        with open(os.path.join(folder, STATE_FILE), encoding="utf-8") as handle:
            self.load_state_dict(json.load(handle))
        self.agent.load_full_state_dict(torch.load(os.path.join(folder, AGENT_FILE), weights_only=True))
