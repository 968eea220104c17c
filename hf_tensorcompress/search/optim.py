"""Keeping an optimizer in step with layers whose parameters were replaced (CP/SVD rank changes)."""

from __future__ import annotations

import torch
from torch import nn


def replace_parameters_in_optimizer(
    optimizer: torch.optim.Optimizer, replaced: dict[nn.Parameter, nn.Parameter]
) -> int:
    """Swap old parameters for new ones inside ``optimizer``'s param groups; returns how many were swapped.

    The paper's public code skipped this after a rank change, so the new factors silently stopped training.
    The optimizer object (and any LR scheduler bound to it) stays the same; the state of a swapped parameter
    (Adam's moments) is dropped because its shape changed, so it restarts like a freshly added parameter.
    """
    swapped = 0
    for group in optimizer.param_groups:
        for index, param in enumerate(group["params"]):
            new = replaced.get(param)
            if new is not None and new is not param:
                group["params"][index] = new
                optimizer.state.pop(param, None)
                swapped += 1
    return swapped
