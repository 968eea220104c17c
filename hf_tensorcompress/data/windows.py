"""Sliding windows over one split, shaped for a model's config, usable directly as a ``Trainer`` train_dataset."""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel

from .standardize import standardization_of
from .time_features import NUM_TIME_FEATURES, TIME_FEATURES, time_features

#: model_type -> whether the model needs lags and time features (the GluonTS-style seq2seq forecasters).
FORECASTERS = {"patchtst": False, "autoformer": True, "informer": True}


@dataclass(frozen=True)
class WindowShape:
    """Lengths a model expects: ``history`` past steps (context + lags) and ``horizon`` future steps."""

    history: int
    horizon: int
    channels: int
    time_features: bool


def window_shape(config: PretrainedConfig) -> WindowShape:
    """Window lengths from a PatchTST, Autoformer or Informer config; an error names the supported ones."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FORECASTERS:
        raise ValueError(f"cannot window data for model_type={model_type!r}; supported: {sorted(FORECASTERS)}")
    if model_type == "patchtst":
        return WindowShape(config.context_length, config.prediction_length, config.num_input_channels, False)
    extra = {
        name: getattr(config, name)
        for name in ("num_dynamic_real_features", "num_static_real_features", "num_static_categorical_features")
        if getattr(config, name)
    }
    if extra:
        raise ValueError(f"windows carry no dynamic/static features, but the config asks for {extra}; set them to 0")
    if config.num_time_features != NUM_TIME_FEATURES:
        raise ValueError(
            f"config.num_time_features={config.num_time_features}, but the windows carry {NUM_TIME_FEATURES} time "
            f"features {TIME_FEATURES}; build the config with num_time_features={NUM_TIME_FEATURES}"
        )
    history = config.context_length + max(config.lags_sequence)
    return WindowShape(history, config.prediction_length, config.input_size, True)


class ForecastingWindows(Dataset):
    """Windows ``[start, start + history + horizon)`` for start = 0, stride, 2·stride, ... within one split.

    Items are dicts of tensors named like the model's forward arguments (the Trainer passes them as kwargs):
    PatchTST gets ``past_values`` (history, channels), ``past_observed_mask`` and ``future_values`` (horizon,
    channels); Autoformer/Informer also ``past_time_features``/``future_time_features`` and
    ``future_observed_mask``. Missing values (NaN) become 0 with their observed-mask entry 0.
    ``future_mask=True`` adds ``future_observed_mask`` for PatchTST too (its forward does not take it: for trainers
    that compute a masked loss themselves, ``training.forecasting.ForecastTrainer``).
    ``scored_mask(index)`` marks the future values a metric scores: observed, and in a target channel.
    Windows never cross split borders, so a split with fewer than ``history + horizon`` rows is an error.
    """

    def __init__(
        self,
        split: datasets.Dataset,
        config: PretrainedConfig | PreTrainedModel,
        stride: int = 1,
        future_mask: bool = False,
    ):
        config = getattr(config, "config", config)
        self.shape = window_shape(config)
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride={stride!r} must be an int >= 1")
        stats = standardization_of(split)
        if len(stats.columns) != self.shape.channels:
            raise ValueError(
                f"the data has {len(stats.columns)} channels {list(stats.columns)}, the model expects "
                f"{self.shape.channels}; pick columns=... when loading, or build the config with "
                f"{'num_input_channels' if config.model_type == 'patchtst' else 'input_size'}={len(stats.columns)}"
            )
        span = self.shape.history + self.shape.horizon
        if len(split) < span:
            raise ValueError(
                f"the {split.split or 'given'} split has {len(split)} rows, fewer than one window needs "
                f"({self.shape.history} past + {self.shape.horizon} future = {span}); use a shorter context length/"
                "horizon (recipe flags --context/--context-length, --horizon) or more data"
            )
        frame = split.with_format(None).to_pandas()
        values = frame[list(stats.columns)].to_numpy(dtype=np.float32)
        self.observed = torch.from_numpy(~np.isnan(values))
        self.values = torch.from_numpy(np.nan_to_num(values, nan=0.0))
        if self.shape.time_features:
            if stats.timestamp_column is None:
                raise ValueError(
                    f"{config.model_type} needs time features, but the data has no timestamp column; load it with "
                    "timestamp_column=<date column> (recipe flag --timestamp-column NAME) or timestamp_columns=[...] "
                    "(--timestamp-columns year month day hour), or use a model without time features (patchtst)"
                )
            self.time = torch.from_numpy(time_features(frame[stats.timestamp_column]))
        self.starts = range(0, len(split) - span + 1, stride)
        self.squeeze = self.shape.time_features and self.shape.channels == 1  # univariate GluonTS models: (steps,)
        self.future_mask = future_mask or self.shape.time_features
        self.targets = torch.tensor([name in stats.target_columns for name in stats.columns])

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index]
        middle, end = start + self.shape.history, start + self.shape.history + self.shape.horizon
        past, future = slice(start, middle), slice(middle, end)
        item = {
            "past_values": self.values[past],
            "past_observed_mask": self.observed[past],
            "future_values": self.values[future],
        }
        if self.future_mask:
            item["future_observed_mask"] = self.observed[future]
        if self.shape.time_features:
            item["past_time_features"] = self.time[past]
            item["future_time_features"] = self.time[future]
            if self.squeeze:
                item = {k: v.squeeze(-1) if k.endswith(("values", "mask")) else v for k, v in item.items()}
        return item

    def scored_mask(self, index: int) -> torch.Tensor:
        """The future values of window ``index`` a metric scores (observed, in a target channel), shaped like
        its ``future_values``."""
        start = self.starts[index] + self.shape.history
        mask = self.observed[start : start + self.shape.horizon] & self.targets
        return mask.squeeze(-1) if self.squeeze else mask


def forecasting_windows(
    split: datasets.Dataset, config: PretrainedConfig | PreTrainedModel, stride: int = 1, future_mask: bool = False
) -> ForecastingWindows:
    """Windows of ``split`` shaped for ``config`` (or a model); ``stride`` > 1 keeps training sets small."""
    return ForecastingWindows(split, config, stride, future_mask)
