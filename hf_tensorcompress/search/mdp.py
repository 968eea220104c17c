"""The MDP of Algorithm 1 as a state machine driven by the trainer at the end of every stage.

Per stage the trainer feeds the training loss (or accuracy) and the Taylor importance; ``end_stage`` then
  1. completes the pending transition (s_t, a_t): reward from the stage metric before and after a_t, A2C update;
  2. marks the layer decided when its last k actions agree (or the safeguard cap is hit);
  3. selects the least important undecided layer (kept until it is decided) and chooses its next rank ε-greedily.
The stage that ends one layer's search also serves as the first stage of the next one (its loss was measured on
the current structure), which saves one stage per layer compared with restarting Algorithm 1's outer loop.
Only the main process runs this; the trainer broadcasts the returned record.
"""

from __future__ import annotations

import json
import os
import random

import torch

from .agent import ActorCritic, masked_log_softmax
from .config import SearchConfig
from .encoder import StateEncoder, build_vocabulary, describe
from .importance import TaylorImportance
from .reward import REWARDS
from .space import AttentionGroup, Width, allowed_actions

STATE_FILE = "search_state.json"
AGENT_FILE = "search_agent.pt"


class RankSearch:
    def __init__(
        self,
        groups: list[AttentionGroup],
        ranks: dict[str, int],
        config: SearchConfig,
        bits: dict[str, Width] | None = None,
    ) -> None:
        self.groups = groups
        self.by_name = {group.name: group for group in groups}
        self.config = config
        self.ranks = dict(ranks)
        self.bits = {group.name: (bits or {}).get(group.name) for group in groups}
        self.width = max(len(group.actions) for group in groups)
        with torch.random.fork_rng():  # agent init must not disturb (or depend on) the training RNG
            torch.manual_seed(config.seed)
            vocabulary = build_vocabulary(groups, ranks, self.bits)
            fields = len(describe(groups[0], ranks[groups[0].name], self.bits[groups[0].name]))
            encoder = StateEncoder(vocabulary, config.embedding_dim, config.lstm_units, fields)
            self.agent = ActorCritic(encoder, self.width, config.hidden_units, config.gamma, config.learning_rate)
        self.rng = random.Random(config.seed)
        self.importance = TaylorImportance(groups)
        self.decided: dict[str, int] = {}
        self.current: str | None = None
        self.actions: dict[str, list[tuple[int, Width]]] = {group.name: [] for group in groups}
        self.pending: dict | None = None
        self.actions_taken = 0
        self.trace: list[dict] = []
        self.metric_sum = 0.0
        self.metric_count = 0

    # ------------------------------------------------------------------ observation
    @property
    def done(self) -> bool:
        return len(self.decided) == len(self.groups)

    def _tokens(self) -> list[list[int]]:
        encoder = self.agent.encoder
        return encoder.encode_tokens(
            [describe(group, self.ranks[group.name], self.bits[group.name]) for group in self.groups]
        )

    def _mask(self, name: str) -> list[bool]:
        index = self.by_name[name].position
        in_bytes = self.config.byte_budget is not None
        return allowed_actions(
            self.groups, index, self.ranks, set(self.decided), self.config.budget, self.width, self.bits, in_bytes
        )

    # ------------------------------------------------------------------ one stage
    def end_stage(self, step: int, metric: float) -> dict:
        """Advance the MDP by one stage; returns the record (``changes`` = {group: new rank}, ``bit_changes`` =
        {group: new factor bits} to apply)."""
        importance = self.importance.state_dict()
        record: dict = {"step": step, "metric": metric, "importance": importance, "changes": {}, "bit_changes": {}}
        if self.pending is not None:
            self._complete_transition(record, metric)
        if not self.done:
            if self.current is None:
                undecided = [g for g in self.groups if g.name not in self.decided]
                self.current = min(undecided, key=lambda g: (importance[g.name], g.position)).name
            self._act(record, metric)
        record.update(ranks=dict(self.ranks), bits=dict(self.bits), decided=sorted(self.decided), done=self.done)
        self.trace.append(record)
        self.importance.reset()
        return record

    def _complete_transition(self, record: dict, metric: float) -> None:
        pending, self.pending = self.pending, None
        name = pending["group"]
        reward = REWARDS[self.config.reward](pending["metric"], metric, self.config.tolerance)
        position = self.by_name[name].position
        stats = self.agent.update(
            (pending["tokens"], position), pending["action"], pending["mask"], reward, (self._tokens(), position)
        )
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

    def _take(self, name: str, action: tuple[int, Width], record: dict) -> None:
        """Set ``name`` to ``action`` (rank, factor bits), noting in ``record`` what the trainer must change."""
        rank, bits = action
        if rank != self.ranks[name]:
            record["changes"][name] = rank
        if bits != self.bits[name] and self.by_name[name].widths != (None,):
            record["bit_changes"][name] = bits
            self.bits[name] = bits
        self.ranks[name] = rank

    def _decide(self, name: str, record: dict) -> None:
        self.decided[name] = self.ranks[name]
        self.current = None
        record["decided_layer"] = name

    def _act(self, record: dict, metric: float) -> None:
        name = self.current
        group = self.by_name[name]
        mask = self._mask(name)
        tokens = self._tokens()
        epsilon = self.config.epsilon(self.actions_taken)
        slot, explored = self.agent.act(tokens, group.position, mask, epsilon, self.rng)
        rank, bits = group.actions[slot]
        self.pending = {"group": name, "tokens": tokens, "action": slot, "mask": mask, "metric": metric}
        self.actions[name].append((rank, bits))
        self.actions_taken += 1
        record.update(
            layer=name,
            position=group.position,
            layer_importance=record["importance"][name],
            rank=rank,
            previous_rank=self.ranks[name],
            bits_chosen=bits,
            previous_bits=self.bits[name],
            explored=explored,
            epsilon=epsilon,
        )
        self._take(name, (rank, bits), record)

    def observe(self, metric: float) -> None:
        self.metric_sum += float(metric)
        self.metric_count += 1

    def mirror(self, record: dict) -> None:
        """Follow the main process's decision on another process (ranks and progress, not the agent)."""
        self.ranks = dict(record["ranks"])
        self.bits = dict(record.get("bits", self.bits))
        self.decided = {name: self.ranks[name] for name in record["decided"]}
        self.trace.append(record)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "config": self.config.to_dict(),
            "vocabulary": self.agent.encoder.vocabulary,
            "ranks": self.ranks,
            "bits": self.bits,
            "decided": self.decided,
            "current": self.current,
            "actions": self.actions,
            "pending": self.pending,
            "actions_taken": self.actions_taken,
            "trace": self.trace,
            "importance": self.importance.state_dict(),
            "metric_sum": self.metric_sum,
            "metric_count": self.metric_count,
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict) -> None:
        if state["vocabulary"] != self.agent.encoder.vocabulary:
            raise ValueError(
                "the checkpoint's search state was made for different attention layers (its state vocabulary "
                "differs); resume with the same model and compression config"
            )
        self.ranks = {name: int(rank) for name, rank in state["ranks"].items()}
        self.decided = {name: int(rank) for name, rank in state["decided"].items()}
        self.current = state["current"]
        self.bits = {name: state.get("bits", {}).get(name) for name in self.bits}
        self.actions = {name: [_action(value) for value in values] for name, values in state["actions"].items()}
        self.pending = state["pending"]
        self.actions_taken = int(state["actions_taken"])
        self.trace = list(state["trace"])
        self.importance.load_state_dict(state["importance"])
        self.metric_sum, self.metric_count = float(state["metric_sum"]), int(state["metric_count"])
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


def _action(value) -> tuple[int, Width]:
    """An action history entry as saved (a [rank, bits] pair, or a bare rank from a rank-only search)."""
    return (int(value), None) if isinstance(value, int) else (int(value[0]), value[1])
