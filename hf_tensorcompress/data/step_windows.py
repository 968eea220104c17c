"""Windows ``[x_{t-w+1}, …, x_t]`` for models that predict (or reconstruct) the last step t from the steps before
it: SBT's single-step forecasting and anomaly detection. One implementation for both tasks."""

from __future__ import annotations

import datasets
import numpy as np


def step_windows(
    values: np.ndarray, window: int, stride: int = 1, labels: np.ndarray | None = None
) -> datasets.Dataset:
    """``past_values``/``past_observed_mask`` (window, channels) per start 0, stride, …; ``target_values`` is the
    label of each window's step t (0 without labels). NaNs become 0 with mask 0."""
    if window < 2 or stride < 1:
        raise ValueError(f"window={window} must be >= 2 and stride={stride} >= 1 (--window, --stride)")
    values = np.asarray(values, dtype=np.float32).reshape(len(values), -1)
    if len(values) < window:
        raise ValueError(f"{len(values)} time steps are fewer than one window of {window} (--window)")
    starts = np.arange(0, len(values) - window + 1, stride)
    stacked = np.stack([values[s : s + window] for s in starts])
    targets = (
        np.zeros(len(starts), np.int64) if labels is None else np.asarray(labels)[starts + window - 1].astype(np.int64)
    )
    shape = stacked.shape[1:]
    features = datasets.Features(
        {
            "past_values": datasets.Array2D(shape, "float32"),
            "past_observed_mask": datasets.Array2D(shape, "float32"),
            "target_values": datasets.Value("int64"),
        }
    )
    data = {
        "past_values": np.nan_to_num(stacked),
        "past_observed_mask": (~np.isnan(stacked)).astype(np.float32),
        "target_values": targets,
    }
    return datasets.Dataset.from_dict(data, features=features).with_format("torch")


def split_values(split: datasets.Dataset, columns: list[str]) -> np.ndarray:
    """(rows, channels) float32 of a prepared forecasting split (standardised; NaN where missing)."""
    return split.with_format(None).to_pandas()[columns].to_numpy(np.float32)
