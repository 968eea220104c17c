"""Table -> ``DatasetDict``: chronological train/validation/test split, channels standardised with training statistics."""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pandas as pd

from .layout import Layout, Tidy, tidy
from .standardize import Standardization

SPLITS = ("train", "validation", "test")


def _frames(data: pd.DataFrame | datasets.Dataset | datasets.DatasetDict) -> dict[str, pd.DataFrame] | pd.DataFrame:
    """One frame to be split, or the three frames of a DatasetDict that is already split."""
    if isinstance(data, pd.DataFrame):
        return data.reset_index(drop=True)
    if isinstance(data, datasets.Dataset):
        return data.with_format(None).to_pandas()
    if isinstance(data, (datasets.DatasetDict, dict)):
        names = list(data)
        if set(SPLITS) <= set(names):
            return {name: data[name].with_format(None).to_pandas() for name in SPLITS}
        if len(names) == 1:
            return data[names[0]].with_format(None).to_pandas()
        raise ValueError(
            f"the DatasetDict has splits {names}: pass one split (e.g. data[{names[0]!r}]) to have it split "
            f"chronologically, or a DatasetDict with exactly the splits {list(SPLITS)}"
        )
    raise TypeError(
        f"cannot read forecasting data from {type(data).__name__}; pass a pandas DataFrame, a datasets.Dataset "
        "or DatasetDict, or use load_forecasting_csv / load_forecasting_dataset for a path or dataset id"
    )


def check_split_ratios(ratios: Sequence[float]) -> None:
    if len(ratios) != 3 or any(r <= 0 for r in ratios) or abs(sum(ratios) - 1) > 1e-6:
        raise ValueError(
            f"split_ratios={tuple(ratios)} must be three positive fractions summing to 1, e.g. (0.7, 0.1, 0.2)"
        )


def split_sizes(rows: int, ratios: Sequence[float]) -> tuple[int, int, int]:
    """Train and test get ``int(rows·ratio)``, validation the rest (the Informer/Autoformer convention)."""
    check_split_ratios(ratios)
    train, test = int(rows * ratios[0]), int(rows * ratios[2])
    sizes = (train, rows - train - test, test)
    if min(sizes) < 1:
        raise ValueError(f"{rows} rows are too few to split {tuple(ratios)}: the splits would have {sizes} rows")
    return sizes


def prepare_forecasting(
    data: pd.DataFrame | datasets.Dataset | datasets.DatasetDict,
    *,
    timestamp_column: str | None = "auto",
    timestamp_columns: Sequence[str] | None = None,
    id_column: str | None = None,
    columns: Sequence[str] | None = None,
    covariates: Sequence[str] = (),
    drop_columns: Sequence[str] = (),
    one_hot: Sequence[str] = (),
    sort_timestamps: bool = False,
    split_ratios: Sequence[float] = (0.7, 0.1, 0.2),
) -> datasets.DatasetDict:
    """Split ``data`` chronologically into train/validation/test and standardise every channel with train statistics.

    Args:
        data: one table (split by ``split_ratios`` in time order) or a DatasetDict that already has
            train/validation/test splits (kept as they are).
        timestamp_column: ``"auto"`` (a datetime column or one named date/datetime/timestamp/time/ds), a name, or
            ``None``. Kept as a timestamp column; Autoformer/Informer windows build time features from it.
        timestamp_columns: calendar columns (year, month, day[, hour[, minute[, second]]], in that order) combined
            into a column ``timestamp`` instead.
        id_column: long-format data (one row per time and series): pivoted to one channel per series × value column.
        columns: the target channels; default every numeric column except the timestamp, id, covariates and
            ``drop_columns`` (text columns, row counters and calendar fields are then errors naming what to pass).
        covariates: channels fed to the model but not scored by the metrics.
        drop_columns: columns to leave out. one_hot: categorical columns turned into 0/1 channels.
        sort_timestamps: sort rows by time; without it, rows out of time order are an error.
    Returns:
        DatasetDict with the timestamp (if any) and float32 channels; missing values stay NaN (windows mask them, in
        training and in every metric). ``standardization_of(result)`` gives the statistics, to un-scale forecasts.
    """
    layout = Layout(
        timestamp_column,
        timestamp_columns,
        id_column,
        columns,
        tuple(covariates),
        tuple(drop_columns),
        tuple(one_hot),
        sort_timestamps,
    )
    check_split_ratios(split_ratios)
    frames = _frames(data)
    if isinstance(frames, pd.DataFrame):
        table = tidy(frames, layout)
        train, validation, _ = split_sizes(len(table.frame), split_ratios)
        bounds = (0, train, train + validation, len(table.frame))
        tables = {name: _rows(table, bounds[i], bounds[i + 1]) for i, name in enumerate(SPLITS)}
    else:
        tables = {name: tidy(frame, layout) for name, frame in frames.items()}
        missing = {
            name: [c for c in tables["train"].channels if c not in t.frame.columns] for name, t in tables.items()
        }
        if any(missing.values()):
            raise ValueError(f"the splits do not share the training split's channels; missing: {missing}")
        empty = [name for name, t in tables.items() if len(t.frame) == 0]
        if empty:
            raise ValueError(f"split(s) {empty} have no rows; every one of {list(SPLITS)} needs data")
    first = tables["train"]
    values = {name: t.frame[first.channels].to_numpy(dtype=np.float64) for name, t in tables.items()}
    empty_channels = [c for c, seen in zip(first.channels, np.isfinite(values["train"]).any(axis=0)) if not seen]
    if empty_channels:
        raise ValueError(
            f"channel(s) {empty_channels} have no value in the training split; leave them out (drop_columns)"
        )
    stats = Standardization.fit(values["train"], first.channels, first.timestamp, first.targets, first.unused)
    splits = {}
    for name, table in tables.items():
        frame = pd.DataFrame(stats.apply(values[name]).astype(np.float32), columns=first.channels)
        if first.timestamp:
            frame.insert(0, first.timestamp, table.frame[first.timestamp].to_numpy())
        info = datasets.DatasetInfo(description=stats.to_json())
        splits[name] = datasets.Dataset.from_pandas(frame, info=info, preserve_index=False, split=name)
    return datasets.DatasetDict(splits)


def _rows(table: Tidy, start: int, stop: int) -> Tidy:
    return Tidy(table.frame.iloc[start:stop], table.timestamp, table.targets, table.covariates, table.unused)
