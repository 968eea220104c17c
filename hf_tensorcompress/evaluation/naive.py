"""Naive forecasts scored exactly as the models are (same windows, same masks, same metric modules): a comparison
says little where the trained model does not beat predicting the training mean, the last value or the last season."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
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


def natural_seasons(stamps: pd.Series, context: int) -> list[int]:
    """Steps in a day and in a week at the data's frequency, those a window's ``context`` holds: the seasons a
    seasonal naive forecast repeats (hourly data: 24 and 168; 10-minute data: 144, a week being longer than a
    336-step context). Empty where the timestamps are not evenly spaced or a day is not a whole number of steps."""
    if len(stamps) < 3:
        return []
    step = pd.to_timedelta(pd.DatetimeIndex(stamps).to_series().diff().dropna().mode().iloc[0])
    if step <= pd.Timedelta(0):
        return []
    seasons = []
    for period in (pd.Timedelta(days=1), pd.Timedelta(days=7)):
        steps, remainder = divmod(period, step)
        if remainder == pd.Timedelta(0) and 2 <= steps <= context:
            seasons.append(int(steps))
    return seasons


def evaluate_naive(
    windows: Dataset,
    seasons: Sequence[int],
    *,
    metrics: tuple[str, ...] = ("mse", "mae"),
    batch_size: int = 64,
) -> dict[str, dict[str, float]]:
    """``{forecast: {metric: value}}`` for every naive forecast on ``windows`` (only scored values count), one
    ``last-season-<steps>`` entry per season. The last ``past_values`` steps are the context's last steps (lags
    come first in Autoformer/Informer windows)."""
    kinds = {"training-mean": ("training-mean", 0), "last-value": ("last-value", 0)}
    kinds.update({f"last-season-{season}": ("last-season", season) for season in seasons})
    modules = {kind: {name: load_metric(name) for name in metrics} for kind in kinds}
    for batch, scored in DataLoader(ScoredWindows(windows), batch_size=batch_size):
        future = batch["future_values"]
        references = future.flatten(1).float().masked_fill(~scored.flatten(1), float("nan")).numpy()
        past = batch["past_values"].float()
        for kind, (forecast, season) in kinds.items():
            predictions = naive_forecast(forecast, past, future.shape[1], season).flatten(1).numpy()
            for module in modules[kind].values():
                module.add_batch(predictions=predictions, references=references)
    return {
        kind: {name: module.compute()[name] for name, module in by_name.items()} for kind, by_name in modules.items()
    }
