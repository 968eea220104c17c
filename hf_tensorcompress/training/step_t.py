"""SBT's single-step objective (Step-T attention): the loss on step t of the prediction ``evaluation`` scores."""

from __future__ import annotations

import torch

from ..evaluation.sequences import step_t_prediction


def step_t_loss(model, batch: dict[str, torch.Tensor], zero_current: bool, instance_norm: bool) -> torch.Tensor:
    """Squared error at step t over its observed values."""
    prediction = step_t_prediction(model, batch["past_values"], zero_current, instance_norm)
    observed = batch["past_observed_mask"][:, -1]
    error = (prediction - batch["past_values"][:, -1]).square() * observed
    return error.sum() / observed.sum().clamp_min(1)
