"""Naive forecasts scored exactly as the models are (same windows, same masks, same metric modules): a comparison
says little where the trained model does not beat predicting the training mean, the last value or the last season."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from .forecasting import ScoredWindows
from .metrics import load_metric

NAIVE = ("training-mean", "last-value", "last-season")


def naive_forecast(kind: str, past: torch.Tensor, horizon: int, season: int) -> torch.Tensor:
    """(batch, horizon, channels) from ``past`` (batch, time, channels) of standardised data: ``training-mean``
    predicts 0 (the training mean after standardisation), ``last-value`` repeats the last step, ``last-season``
    repeats the last ``season`` steps."""
    if kind == "training-mean":
        return past.new_zeros(past.shape[0], horizon, *past.shape[2:])
    if kind == "last-value":
        return past[:, -1:].expand(-1, horizon, *past.shape[2:])
    if kind == "last-season":
        if season > past.shape[1]:
            raise ValueError(f"season {season} is longer than the {past.shape[1]} past steps a window holds")
        repeats = -(-horizon // season)
        return past[:, -season:].repeat(1, repeats, *([1] * (past.dim() - 2)))[:, :horizon]
    raise ValueError(f"naive forecast {kind!r}; choose one of {list(NAIVE)}")


def evaluate_naive(
    windows: Dataset, season: int, *, metrics: tuple[str, ...] = ("mse", "mae"), batch_size: int = 64
) -> dict[str, dict[str, float]]:
    """``{forecast: {metric: value}}`` for every naive forecast on ``windows`` (only scored values count). The last
    ``past_values`` steps are the context's last steps (lags come first in Autoformer/Informer windows)."""
    modules = {kind: {name: load_metric(name) for name in metrics} for kind in NAIVE}
    for batch, scored in DataLoader(ScoredWindows(windows), batch_size=batch_size):
        future = batch["future_values"]
        references = future.flatten(1).float().masked_fill(~scored.flatten(1), float("nan")).numpy()
        past = batch["past_values"].float()
        for kind in NAIVE:
            predictions = naive_forecast(kind, past, future.shape[1], season).flatten(1).numpy()
            for module in modules[kind].values():
                module.add_batch(predictions=predictions, references=references)
    return {
        kind: {name: module.compute()[name] for name, module in by_name.items()} for kind, by_name in modules.items()
    }
