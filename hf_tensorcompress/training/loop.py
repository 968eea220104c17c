"""A fixed number of optimizer steps with validation-based model selection: the budget every arm of a comparison
shares, stated in steps (not epochs, whose step count depends on the dataset size and the batch size)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm


@dataclass(frozen=True)
class StepBudget:
    """Steps and learning rates. ``score_learning_rate`` applies to biprop's ``scores`` (only their order matters,
    so their scale, and the step that moves it, is arbitrary); every other parameter gets ``learning_rate``."""

    steps: int
    batch_size: int
    learning_rate: float
    score_learning_rate: float
    validate_every: int
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "validate_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1 (--{name.replace('_', '-')})")
        if self.learning_rate <= 0 or self.score_learning_rate <= 0:
            raise ValueError("learning rates must be > 0 (--learning-rate, --score-learning-rate)")


@dataclass(frozen=True)
class TrainingOutcome:
    steps: int
    seconds: float
    selected_step: int
    validation: tuple[float, ...]


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer (not ``state_dict``: compressed layers may save a packed form)."""
    return {name: tensor.detach().clone() for name, tensor in _tensors(model).items()}


def restore(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, tensor in _tensors(model).items():
            tensor.copy_(saved[name])


def parameter_groups(model: torch.nn.Module, budget: StepBudget) -> list[dict]:
    scores = [p for n, p in model.named_parameters() if n.endswith("scores")]
    weights = [p for n, p in model.named_parameters() if not n.endswith("scores")]
    groups = [{"params": weights, "lr": budget.learning_rate, "weight_decay": budget.weight_decay}]
    if scores:
        groups.append({"params": scores, "lr": budget.score_learning_rate, "weight_decay": 0.0})
    return groups


def train_for_steps(
    model: torch.nn.Module,
    data: Dataset,
    loss: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor],
    budget: StepBudget,
    validate: Callable[[torch.nn.Module], tuple[float, ...]],
    accelerator: Accelerator,
    label: str = "train",
) -> TrainingOutcome:
    """AdamW with a one-cycle schedule for exactly ``budget.steps`` steps (cycling through ``data`` as often as
    needed); every ``validate_every`` steps and at the end, ``validate(model)`` (higher is better) decides which
    weights are kept: a later check replaces them unless it scores worse (ties go to the longer-trained weights).
    The model ends with the selected weights, in eval mode."""
    optimizer = torch.optim.AdamW(parameter_groups(model, budget))
    loader = DataLoader(data, batch_size=budget.batch_size, shuffle=True, drop_last=len(data) > budget.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=budget.steps, pct_start=0.1
    )
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    best: tuple[tuple[float, ...], int, dict[str, torch.Tensor]] | None = None
    start, step = time.perf_counter(), 0
    bar = tqdm(total=budget.steps, desc=label, disable=not accelerator.is_local_main_process, leave=False)
    model.train()
    while step < budget.steps:
        for batch in loader:
            value = loss(model, batch)
            optimizer.zero_grad()
            accelerator.backward(value)
            optimizer.step()
            schedule.step()
            step += 1
            bar.update()
            if step % budget.validate_every == 0 or step == budget.steps:
                model.eval()
                score = tuple(validate(accelerator.unwrap_model(model)))
                model.train()
                if best is None or score >= best[0]:
                    best = (score, step, snapshot(model))
            if step >= budget.steps:
                break
    bar.close()
    seconds = time.perf_counter() - start
    restore(model, best[2])
    model.eval()
    return TrainingOutcome(budget.steps, seconds, best[1], best[0])
