"""The paper's rewards: (14) on the mean training loss of two consecutive stages, (13) on accuracy."""

from __future__ import annotations


def loss_reward(before: float, after: float, tolerance: float) -> float:
    """``loss_t / loss_{t+1}`` if ``loss_{t+1} ≤ ε·loss_t``, else ``−loss_{t+1} / loss_t`` (paper: ε = 1.125)."""
    before, after = max(before, 1e-12), max(after, 1e-12)
    return before / after if after <= tolerance * before else -after / before


def accuracy_reward(before: float, after: float, tolerance: float) -> float:
    """``acc_{t+1} / acc_t`` if ``acc_{t+1} ≥ acc_t − ε``, else ``−acc_t / acc_{t+1}`` (paper: ε = 0.1)."""
    before, after = max(before, 1e-12), max(after, 1e-12)
    return after / before if after >= before - tolerance else -before / after


REWARDS = {"loss": loss_reward, "accuracy": accuracy_reward, "validation_loss": loss_reward}
