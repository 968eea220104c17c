"""``Trainer`` pieces for forecasters: the MSE of the point forecast over observed values as the loss (missing
values masked for every family, PatchTST included), optionally distilled from a trained teacher, and model selection
on the validation MSE."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import Dataset
from transformers import Trainer

from ..evaluation.forecasting import evaluate_forecaster
from ..search.trainer import SmartformerTrainer
from .averaging import WeightAverage, search_done
from .checkpoint_state import CheckpointedCallback, LatentCheckpoints


def point_forecast_for_training(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """PatchTST's prediction head; for Autoformer/Informer the mean of the forecast distribution from one forward
    (the decoder is teacher-forced in training; at evaluation ``evaluation.point_forecast`` makes Informer generate)."""
    if model.config.model_type == "patchtst":
        return model(
            past_values=batch["past_values"], past_observed_mask=batch.get("past_observed_mask")
        ).prediction_outputs
    outputs = model(**batch)
    return model.output_distribution(outputs.params, loc=outputs.loc, scale=outputs.scale).mean


#: Configuration fields a teacher must share with the student for their forecasts to match position by position.
MATCHING_FIELDS = ("model_type", "context_length", "prediction_length", "num_input_channels", "input_size")


def checked_teacher(
    teacher: torch.nn.Module | None, weight: float, student: torch.nn.Module, device: torch.device
) -> torch.nn.Module | None:
    """``teacher`` ready to score batches (eval mode, on ``device``), after checking that it forecasts what the student
    does and that ``weight`` is a fraction; None without a teacher."""
    if teacher is None:
        return None
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"distill_weight={weight}: the teacher's share of the loss must be in (0, 1], e.g. 0.5")
    if not isinstance(teacher, torch.nn.Module) or not hasattr(teacher, "config"):
        raise TypeError(
            f"teacher is a {type(teacher).__name__}; pass a trained transformers forecaster (the dense model)"
        )
    for name in MATCHING_FIELDS:
        ours, theirs = getattr(student.config, name, None), getattr(teacher.config, name, None)
        if ours != theirs:
            raise ValueError(
                f"the teacher's config.{name} is {theirs!r} and the model's is {ours!r}: distillation compares their "
                "forecasts position by position, so pass a teacher trained on the same windows and channels"
            )
    return teacher.to(device).eval()


class MaskedPointLoss:
    """Trainer mixin: MSE of the point forecast over the observed future values (``future_observed_mask``; windows
    built with ``future_mask=True`` carry it for every family).

    With ``teacher`` (a trained forecaster of the same windows, e.g. the dense model a compressed one replaces) the
    loss is ``(1 − w)·MSE(forecast, truth) + w·MSE(forecast, teacher's forecast)`` over the same scored values,
    ``w = distill_weight``: knowledge distillation, hand-written because transformers has no distillation trainer
    for regression (TRL's are for language models). The teacher is put in eval mode, moved to the training device and
    never trained; it is not part of the model, so checkpoints and ``save_pretrained`` do not hold it.
    """

    def __init__(self, *args, teacher: torch.nn.Module | None = None, distill_weight: float = 0.5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.distill_weight = distill_weight
        self.teacher = checked_teacher(teacher, distill_weight, self.model, self.args.device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        forecast = point_forecast_for_training(model.module if hasattr(model, "module") else model, inputs)
        observed = inputs.get("future_observed_mask", torch.ones_like(inputs["future_values"])).float()
        count = observed.sum().clamp_min(1)
        loss = ((forecast - inputs["future_values"]).square() * observed).sum() / count
        if self.teacher is not None:
            with torch.no_grad():
                target = point_forecast_for_training(self.teacher, inputs)
            distilled = ((forecast - target).square() * observed).sum() / count
            loss = (1 - self.distill_weight) * loss + self.distill_weight * distilled
        return (loss, {"forecast": forecast}) if return_outputs else loss


class ForecastTrainer(MaskedPointLoss, Trainer):
    """A ``Trainer`` for forecasters: the masked MSE of the point forecast, ``teacher=`` / ``distill_weight=`` to
    distill (``MaskedPointLoss``). Its checkpoints keep the fp32 weights behind low-bit codes
    (``LatentCheckpoints``), so a resumed quantization-aware run goes on from them, not from the rounded ones."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(LatentCheckpoints())


class ForecastSmartformerTrainer(MaskedPointLoss, SmartformerTrainer):
    """The ``SmartformerTrainer`` search with a forecaster's masked MSE and optional distillation
    (``MaskedPointLoss``)."""


class BestValidation(CheckpointedCallback):
    """Keeps the weights with the lowest validation MSE and restores them when training ends (the early-stopping
    model selection of the Autoformer code), judged every ``every`` steps and at the last step. The best so far
    travels in the Trainer's checkpoints (``CheckpointedCallback``): a resumed run keeps what the uninterrupted one
    would.

    Not the Trainer's ``load_best_model_at_end``: that reloads a disk checkpoint into the final model, and a
    Smartformer run changes layer shapes while its search runs. Here a search run only competes once every
    layer's rank is decided (``final_shape``: when else the shapes are final, e.g. after a ``RankSchedule``), so
    the kept weights always fit the final model. With ``average`` (a ``WeightAverage`` added to the trainer before
    this callback) the averaged weights are judged and kept instead of the live ones.
    """

    file = "best_validation.safetensors"

    def __init__(
        self,
        trainer: Trainer,
        windows: Dataset,
        every: int,
        batch_size: int,
        final_shape: Callable[[], bool] | None = None,
        average: WeightAverage | None = None,
    ) -> None:
        self.trainer, self.windows, self.every, self.batch_size = trainer, windows, every, batch_size
        self.final_shape = final_shape
        self.average = average
        self.best: tuple[float, int, dict[str, torch.Tensor]] | None = None

    def _architecture_final(self) -> bool:
        return self.final_shape() if self.final_shape is not None else search_done(self.trainer)

    def on_step_end(self, args, state, control, **kwargs):
        check_step = state.global_step % self.every == 0 or state.global_step == state.max_steps
        if not check_step or not self._architecture_final():
            return
        model = self.trainer.model if self.average is None else self.average.model()
        mse = evaluate_forecaster(model, self.windows, batch_size=self.batch_size, metrics=("mse",), progress=False)[
            "mse"
        ]
        if self.best is None or mse < self.best[0]:
            self.best = (mse, state.global_step, {k: v.detach().clone() for k, v in model.state_dict().items()})

    def checkpoint_state(self, model):
        if self.best is None:  # no check yet
            return {}, {}
        mse, step, weights = self.best
        return {name: value.contiguous() for name, value in weights.items()}, {"mse": repr(mse), "step": str(step)}

    def restore(self, tensors, metadata, model):
        self.best = (float(metadata["mse"]), int(metadata["step"]), tensors) if metadata else None

    def on_train_end(self, args, state, control, **kwargs):
        if self.best is not None:
            self.trainer.model.load_state_dict(self.best[2])
