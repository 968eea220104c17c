"""Advantage actor-critic (paper §4.1.3): actor π(a|s) and critic v(s), two ReLU layers of 40 units each."""

from __future__ import annotations

import random

import torch
from torch import nn

from .encoder import StateEncoder

#: Rewards (13) and (14) are ratios: 1 for a stage whose loss (or accuracy) did not change.
NEUTRAL_REWARD = 1.0


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs)
    )


def masked_log_softmax(logits: torch.Tensor, mask: list[bool]) -> torch.Tensor:
    allowed = torch.tensor(mask, dtype=torch.bool)
    return torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)


class ActorCritic(nn.Module):
    """Encoder + actor + critic, trained together by one Adam on ``L_actor + L_critic``.

    ``A = R + γ v(s') − v(s)``; ``L_actor = −log π(a|s) · A`` (A treated as a constant), ``L_critic = A²`` with
    ``v(s')`` as a fixed target (semi-gradient TD(0)). The encoder learns through both losses.

    The critic starts at the value of a neutral stage, ``1/(1−γ)`` for rewards (13)/(14) that are 1 when nothing
    changed: from the usual zero start every early advantage is ≈ +R > 0, reinforcing whatever the untrained actor
    picked first; from the neutral value the first advantages are ≈ R − 1 (positive when the loss fell after the
    action, negative when it rose). On the Appliances runs the decisions came out the same either way (rank 4
    everywhere: early training lowers the loss after any action).
    """

    def __init__(
        self, encoder: StateEncoder, actions: int, hidden: int = 40, gamma: float = 0.95, lr: float = 1e-3
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.actor = mlp(encoder.state_dim, hidden, actions)
        self.critic = mlp(encoder.state_dim, hidden, 1)
        nn.init.constant_(self.critic[-1].bias, NEUTRAL_REWARD / (1.0 - gamma) if gamma < 1 else 0.0)
        self.gamma = gamma
        self.optimizer = torch.optim.Adam(self.parameters(), lr=lr)

    @torch.no_grad()
    def act(
        self,
        tokens: list[list[int]],
        position: int,
        mask: list[bool],
        epsilon: float,
        rng: random.Random,
        sample: bool = False,
    ) -> tuple[int, bool]:
        """With probability ε (a *uniform* draw) a random allowed slot, else the most probable one (ε-greedy) or,
        with ``sample``, one drawn from π by ``rng`` (so a resumed search draws the same)."""
        allowed = [slot for slot, ok in enumerate(mask) if ok]
        if rng.random() < epsilon:
            return rng.choice(allowed), True
        log_probs = masked_log_softmax(self.actor(self.encoder(tokens, position)), mask)
        if sample:
            return rng.choices(allowed, weights=log_probs.exp()[allowed].tolist())[0], False
        return int(log_probs.argmax()), False

    def _losses(
        self,
        state: tuple[list[list[int]], int],
        action: int,
        mask: list[bool],
        reward: float,
        next_state: tuple[list[list[int]], int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The transition's actor loss, critic loss and advantage at the current weights."""
        encoded = self.encoder(*state)
        value = self.critic(encoded).squeeze(-1)
        with torch.no_grad():
            next_value = self.critic(self.encoder(*next_state)).squeeze(-1)
        advantage = reward + self.gamma * next_value - value
        log_prob = masked_log_softmax(self.actor(encoded), mask)[action]
        return -log_prob * advantage.detach(), advantage.square(), advantage

    def update(
        self,
        state: tuple[list[list[int]], int],
        action: int,
        mask: list[bool],
        reward: float,
        next_state: tuple[list[list[int]], int],
    ) -> dict[str, float]:
        """One A2C step on the transition (s, a, R, s'); returns the losses and the advantage."""
        actor_loss, critic_loss, advantage = self._losses(state, action, mask, reward, next_state)
        self.optimizer.zero_grad()
        (actor_loss + critic_loss).backward()
        self.optimizer.step()
        return {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item(), "advantage": advantage.item()}

    def replay(self, transitions: list[dict], epochs: int) -> float:
        """``epochs`` Adam steps, each on the mean A2C loss of every transition so far, advantages at the current
        weights; returns the last step's loss. A search sees a few dozen rewards, and one step of about the
        learning rate each leaves the actor near its initial argmax; refitting on all of them lets each reward
        move the policy. Earlier policies took the past actions (an argmax has no behaviour probability to reweight
        by), so the actor's term is advantage-weighted likelihood of past actions, not an on-policy gradient."""
        loss = torch.zeros(())
        for _ in range(epochs):
            terms = []
            for t in transitions:
                next_state = (t["next_tokens"], t["position"])
                actor_loss, critic_loss, _ = self._losses(
                    (t["tokens"], t["position"]), t["action"], t["mask"], t["reward"], next_state
                )
                terms.append(actor_loss + critic_loss)
            loss = torch.stack(terms).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return loss.item()

    def full_state_dict(self) -> dict:
        return {"model": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_full_state_dict(self, state: dict) -> None:
        self.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
