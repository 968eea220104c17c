"""Per-channel standardisation fitted on the training split only, stored with the data so forecasts can be un-scaled."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import datasets
import numpy as np

#: Key under which the statistics live in ``Dataset.info.description`` (survives ``save_to_disk``/``select``).
INFO_KEY = "hf_tensorcompress.standardization"


@dataclass(frozen=True)
class Standardization:
    """``(x - mean) / std`` per channel, with the training split's mean and population std (ddof=0).

    A channel that is constant in the training split gets ``std = 1`` (it is only centred), so no division by zero.
    ``targets``: the channels metrics score (``None``: all); the others are covariates, inputs only.
    ``unused``: columns of the source that became no channel (not named by ``columns`` when it was given), so the
    printed summary can say what was left out.
    """

    columns: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    timestamp_column: str | None = None
    targets: tuple[str, ...] | None = None
    unused: tuple[str, ...] = ()

    @classmethod
    def fit(
        cls,
        values: np.ndarray,
        columns: list[str],
        timestamp_column: str | None,
        targets: list[str] | None = None,
        unused: tuple[str, ...] | list[str] = (),
    ) -> Standardization:
        """Statistics of ``values`` (rows, channels), ignoring NaNs (missing values)."""
        mean = np.nanmean(values, axis=0)
        std = np.nanstd(values, axis=0)
        std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
        chosen = None if targets is None or list(targets) == list(columns) else tuple(targets)
        return cls(
            tuple(columns),
            tuple(float(m) for m in mean),
            tuple(float(s) for s in std),
            timestamp_column,
            chosen,
            tuple(str(name) for name in unused),
        )

    def apply(self, values: np.ndarray) -> np.ndarray:
        return (values - np.asarray(self.mean)) / np.asarray(self.std)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """Back to the original units; the last axis of ``values`` is the channel axis."""
        return np.asarray(values) * np.asarray(self.std) + np.asarray(self.mean)

    def to_json(self) -> str:
        return json.dumps({INFO_KEY: asdict(self)})

    @classmethod
    def from_json(cls, text: str) -> Standardization:
        data = json.loads(text)[INFO_KEY]
        targets = data.get("targets")
        return cls(
            tuple(data["columns"]),
            tuple(data["mean"]),
            tuple(data["std"]),
            data["timestamp_column"],
            None if targets is None else tuple(targets),
            tuple(data.get("unused", ())),
        )

    @property
    def target_columns(self) -> tuple[str, ...]:
        """The channels a forecast is scored on."""
        return self.columns if self.targets is None else self.targets


def standardization_of(data: datasets.Dataset | datasets.DatasetDict) -> Standardization:
    """The statistics a split (or any split of a DatasetDict) was standardised with by ``hf_tensorcompress.data``."""
    split = next(iter(data.values())) if isinstance(data, datasets.DatasetDict) else data
    try:
        return Standardization.from_json(split.info.description or "")
    except (ValueError, KeyError):
        raise ValueError(
            "this dataset carries no standardisation statistics; build it with "
            "hf_tensorcompress.data.prepare_forecasting (or load_appliances_energy / load_forecasting_csv)"
        ) from None
