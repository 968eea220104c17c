"""Training with equal budgets: every arm of a comparison gets the same optimizer steps and is scored with the
weights of its best validation check (``loop``); Trainer pieces for forecasters (``forecasting``)."""

from .loop import StepBudget, TrainingOutcome, train_for_steps

__all__ = ["StepBudget", "TrainingOutcome", "train_for_steps"]
