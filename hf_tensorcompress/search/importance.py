"""Taylor layer importance (Molchanov et al. 2019): Σ (grad · param)², accumulated over a stage."""

from __future__ import annotations

import torch
from torch import nn

from .space import AttentionGroup


def searched_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters whose (grad · param)² measure a searched layer: its factors, else every parameter but the
    bias (a dense or low-bit weight, Biprop's scores)."""
    factors = getattr(module, "factors", None)
    if factors is not None:
        return list(factors)
    return [param for name, param in module.named_parameters() if name != "bias"]


class TaylorImportance:
    """Accumulates, per attention group, Σ over its factor parameters of (grad · param)² at every optimizer step (a
    Linear of the search over forms: over the parameters of its current form, bias aside).

    Called right before ``optimizer.step()``, where gradients are complete (and, under DDP, already averaged
    over processes, so every process sees the same score).
    """

    def __init__(self, groups: list[AttentionGroup]) -> None:
        self.groups = groups
        self.scores = {group.name: 0.0 for group in groups}

    @torch.no_grad()
    def accumulate(self, model: nn.Module) -> None:
        totals = []
        for group in self.groups:
            total = None
            for name in group.modules:
                for param in searched_parameters(model.get_submodule(name)):
                    if param.grad is None:
                        continue
                    term = (param.grad.float() * param.float()).square().sum()
                    total = term if total is None else total + term
            totals.append(total if total is not None else torch.zeros(()))
        values = torch.stack([t.to("cpu") for t in totals]).tolist()  # one device sync for all groups
        for group, value in zip(self.groups, values):
            self.scores[group.name] += value

    def reset(self) -> None:
        self.scores = {name: 0.0 for name in self.scores}

    def state_dict(self) -> dict[str, float]:
        return dict(self.scores)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scores = {name: float(state.get(name, 0.0)) for name in self.scores}
