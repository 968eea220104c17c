"""Test-set MSE/MAE of a forecasting model, computed by the project's own ``evaluate`` metric modules."""

from __future__ import annotations

import inspect

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from .metrics import load_metric


def point_forecast(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch, horizon[, channels]) point forecast, the cheapest exact one each family allows.

    PatchTST: its prediction head. Autoformer: the mean of the forecast distribution from one forward (its
    decoder input is built from the context only, so passing ``future_values`` for the loss leaks nothing).
    Informer (teacher-forced decoder) and any other model: the mean of ``model.generate``'s samples
    (``mean_feedback.mean_feedback_forecast`` is the deterministic one an exported ONNX Informer gives).
    """
    model_type = getattr(model.config, "model_type", None)
    batch = {key: value for key, value in batch.items() if key != "future_observed_mask" or model_type != "patchtst"}
    if model_type == "patchtst":
        return model(
            past_values=batch["past_values"], past_observed_mask=batch.get("past_observed_mask")
        ).prediction_outputs
    if model_type == "autoformer":
        outputs = model(**batch)
        return model.output_distribution(outputs.params, loc=outputs.loc, scale=outputs.scale).mean
    accepted = inspect.signature(model.generate).parameters
    inputs = {key: value for key, value in batch.items() if key in accepted}
    return model.generate(**inputs).sequences.mean(dim=1)


class ScoredWindows(Dataset):
    """``(item, scored mask)`` pairs: the mask from ``windows.scored_mask`` (all ones for windows without one)."""

    def __init__(self, windows: Dataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        item = self.windows[index]
        if hasattr(self.windows, "scored_mask"):
            return item, self.windows.scored_mask(index)
        return item, torch.ones_like(item["future_values"], dtype=torch.bool)


def evaluate_forecaster(
    model: torch.nn.Module,
    windows: Dataset,
    *,
    metrics: tuple[str, ...] = ("mse", "mae"),
    batch_size: int = 64,
    description: str = "evaluate",
    progress: bool = True,
) -> dict[str, float]:
    """Every window of ``windows`` forecast by ``model`` (eval mode, no grad); returns ``{metric: value}``.

    Values are on the scale the windows hold (standardised data: the usual way forecasting MSE/MAE are reported).
    Only what ``windows.scored_mask`` marks is scored (observed values of target channels): the others reach the
    metric modules as NaN references, which they skip.
    """
    modules = {name: load_metric(name) for name in metrics}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            loader = DataLoader(ScoredWindows(windows), batch_size=batch_size)
            for batch, scored in tqdm(loader, desc=description, disable=not progress):
                batch = {key: value.to(device) for key, value in batch.items()}
                predictions = point_forecast(model, batch).flatten(1).float().cpu().numpy()
                references = (
                    batch["future_values"].flatten(1).float().cpu().masked_fill(~scored.flatten(1), float("nan"))
                )
                references = references.numpy()
                for module in modules.values():
                    module.add_batch(predictions=predictions, references=references)
    finally:
        model.train(was_training)
    return {name: module.compute()[name] for name, module in modules.items()}
