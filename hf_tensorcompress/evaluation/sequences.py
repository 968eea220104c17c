"""Scores of sequence models on ``datasets`` splits of windows or series: classification accuracy (through the
shipped ``accuracy`` module) and step-t forecasting errors (through ``mse``/``mae``, missing values masked)."""

from __future__ import annotations

from collections.abc import Iterator

import datasets
import numpy as np
import torch

from .metrics import load_metric


def _batches(model: torch.nn.Module, split: datasets.Dataset, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    device = next(p for p in [*model.parameters(), *model.buffers()]).device
    torch_split = split.with_format("torch")
    for start in range(0, len(split), batch_size):
        yield {k: v.to(device) for k, v in torch_split[start : start + batch_size].items()}


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


@torch.no_grad()
def classification_scores(model: torch.nn.Module, split: datasets.Dataset, batch_size: int = 256) -> dict[str, float]:
    """``accuracy`` and mean cross-entropy ``loss`` of a ``PatchTSTForClassification`` on padded series."""
    model.eval()
    accuracy, losses = load_metric("accuracy"), []
    for batch in _batches(model, split, batch_size):
        output = model(**batch)
        losses.append(float(output.loss) * len(batch["target_values"]))
        accuracy.add_batch(
            predictions=output.prediction_logits.argmax(-1).cpu().numpy(),
            references=batch["target_values"].cpu().numpy(),
        )
    return {"accuracy": accuracy.compute()["accuracy"], "loss": sum(losses) / len(split)}


def classification_selection(split: datasets.Dataset):
    """Validation criterion for ``train_for_steps``: accuracy. Not the loss: on a small validation split the loss
    rises (over-confidence) while accuracy holds, and a loss tie-break would keep early, under-trained weights."""

    def score(model: torch.nn.Module) -> tuple[float]:
        return (classification_scores(model, split)["accuracy"],)

    return score


@torch.no_grad()
def step_t_errors(model, split: datasets.Dataset, zero_current: bool, instance_norm: bool, batch_size: int = 256):
    """(prediction, reference) arrays (windows, channels) at step t; a reference is NaN where the value is missing."""
    model.eval()
    predictions, references = [], []
    for batch in _batches(model, split, batch_size):
        predictions.append(step_t_prediction(model, batch["past_values"], zero_current, instance_norm).cpu())
        truth = batch["past_values"][:, -1].masked_fill(batch["past_observed_mask"][:, -1] == 0, float("nan"))
        references.append(truth.cpu())
    return torch.cat(predictions).numpy(), torch.cat(references).numpy()


def forecast_scores(predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """Test MSE/MAE through the shipped metric modules (missing references skipped)."""
    return {
        name: load_metric(name).compute(predictions=predictions, references=references)[name] for name in ("mse", "mae")
    }


def anomaly_scores(predictions: np.ndarray, references: np.ndarray) -> np.ndarray:
    """Per-window anomaly score: the squared step-t error, averaged over the observed channels."""
    return np.nanmean((predictions - references) ** 2, axis=-1)
