"""SBT's single-step objective (Step-T attention): predict x_t from the window's earlier steps, loss on step t only."""

from __future__ import annotations

import torch


def step_t_prediction(model, values: torch.Tensor, zero_current: bool, instance_norm: bool = True) -> torch.Tensor:
    """The model's output at the last step (batch × channels), with that step's input zeroed if asked.

    ``instance_norm``: each window is scaled by the mean/std of its history (steps before t) and the output scaled
    back (RevIN, what PatchTST's own scalers do), so level shifts between the training and test periods (e.g.
    spring temperatures after a winter training set) do not push the inputs out of the range the model was trained
    on. The history statistics never see x_t.
    """
    loc = values[:, :-1].mean(dim=1, keepdim=True) if instance_norm else torch.zeros_like(values[:, :1])
    scale = values[:, :-1].std(dim=1, keepdim=True) + 1e-5 if instance_norm else torch.ones_like(values[:, :1])
    inputs = (values - loc) / scale
    if zero_current:
        inputs[:, -1] = 0.0
    out = model(past_values=inputs).prediction_output  # (batch, channels, steps, 1)
    return out[:, :, -1, 0] * scale[:, 0] + loc[:, 0]


def step_t_loss(model, batch: dict[str, torch.Tensor], zero_current: bool, instance_norm: bool) -> torch.Tensor:
    """Squared error at step t over its observed values."""
    prediction = step_t_prediction(model, batch["past_values"], zero_current, instance_norm)
    observed = batch["past_observed_mask"][:, -1]
    error = (prediction - batch["past_values"][:, -1]).square() * observed
    return error.sum() / observed.sum().clamp_min(1)
