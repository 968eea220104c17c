"""Fixed ranks set at one optimizer step of an ordinary ``Trainer`` run.

A search changes ranks *while* it trains: its model first trains at full rank and is cut later. A baseline
trained at low rank from the first step differs from it in two ways at once, where the ranks go and when the cut
happens. ``RankSchedule`` removes the second: full rank until ``step`` (e.g. the step a search finished), then the
baseline's ranks, re-decomposed from the trained factors like the search's own cuts. To resume from a checkpoint
saved after the cut, build the model at the final ranks (the checkpoint's shapes); the schedule then does nothing.
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from .trainer import apply_ranks


class RankSchedule(TrainerCallback):
    """Sets ``ranks`` ({module name: rank}) after optimizer step ``step`` of ``trainer``; ``done`` says whether the
    model has its final ranks (model selection should only compare weights of the final shape)."""

    def __init__(self, trainer: Trainer, step: int, ranks: dict[str, int], als_iterations: int = 12) -> None:
        if step < 1:
            raise ValueError(f"step={step}: ranks can only change after an optimizer step (>= 1)")
        self.trainer, self.step, self.ranks, self.als_iterations = trainer, step, dict(ranks), als_iterations
        self.done = False

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step >= self.step:  # resumed after the cut: the checkpoint loaded, so the model has its ranks
            self.done = True
        if state.max_steps and self.step > state.max_steps:
            raise ValueError(
                f"step={self.step} is after the run's last step ({state.max_steps}): the ranks would never change"
            )

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done and state.global_step >= self.step:
            apply_ranks(self.trainer, self.ranks, self.als_iterations)
            self.done = True
