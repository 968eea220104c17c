"""Table -> ``DatasetDict``: chronological train/validation/test split, channels standardised with training statistics."""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pandas as pd

from .standardize import Standardization

SPLITS = ("train", "validation", "test")
#: Column names taken as the timestamp when ``timestamp_column="auto"`` (case-insensitive).
TIMESTAMP_NAMES = ("date", "datetime", "timestamp", "time", "ds")


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


def _timestamp_column(frame: pd.DataFrame, requested: str | None) -> str | None:
    if requested is None:
        return None
    if requested != "auto":
        if requested not in frame.columns:
            raise ValueError(
                f"timestamp_column={requested!r} is not a column; columns are {list(frame.columns)} "
                "(pass timestamp_column=None for data without timestamps)"
            )
        return requested
    for name in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[name]) or str(name).lower() in TIMESTAMP_NAMES:
            return name
    return None


def _parse_timestamps(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    try:
        stamps = pd.to_datetime(frame[column])
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"timestamp column {column!r} does not parse as dates ({error}); name the right column with "
            "timestamp_column=..., or pass timestamp_column=None"
        ) from None
    frame = frame.assign(**{column: stamps.astype("datetime64[ns]")})
    if not stamps.is_monotonic_increasing:  # a chronological split needs rows in time order
        frame = frame.sort_values(column, kind="stable").reset_index(drop=True)
    return frame


def _channels(frame: pd.DataFrame, columns: Sequence[str] | None, drop: Sequence[str], timestamp: str | None) -> list[str]:
    unknown = [name for name in [*(columns or []), *drop] if name not in frame.columns]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; the data's columns are {list(frame.columns)}")
    if columns is not None:
        wrong = [name for name in columns if not _is_numeric(frame[name])]
        if wrong:
            raise ValueError(f"column(s) {wrong} are not numeric; forecasting channels must be numbers")
        chosen = [name for name in columns if name not in drop]
    else:
        chosen = [name for name in frame.columns if name != timestamp and name not in drop and _is_numeric(frame[name])]
    if not chosen:
        raise ValueError(
            f"no numeric columns to forecast among {list(frame.columns)} (timestamp: {timestamp!r}, dropped: "
            f"{list(drop)}); pass columns=[...] naming numeric columns"
        )
    return chosen


def _is_numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def split_sizes(rows: int, ratios: Sequence[float]) -> tuple[int, int, int]:
    """Train and test get ``int(rows·ratio)``, validation the rest (the Informer/Autoformer convention)."""
    if len(ratios) != 3 or any(r <= 0 for r in ratios) or abs(sum(ratios) - 1) > 1e-6:
        raise ValueError(f"split_ratios={tuple(ratios)} must be three positive fractions summing to 1, e.g. (0.7, 0.1, 0.2)")
    train, test = int(rows * ratios[0]), int(rows * ratios[2])
    sizes = (train, rows - train - test, test)
    if min(sizes) < 1:
        raise ValueError(f"{rows} rows are too few to split {tuple(ratios)}: the splits would have {sizes} rows")
    return sizes


def prepare_forecasting(
    data: pd.DataFrame | datasets.Dataset | datasets.DatasetDict,
    *,
    timestamp_column: str | None = "auto",
    columns: Sequence[str] | None = None,
    drop_columns: Sequence[str] = (),
    split_ratios: Sequence[float] = (0.7, 0.1, 0.2),
) -> datasets.DatasetDict:
    """Split ``data`` chronologically into train/validation/test and standardise every channel with train statistics.

    Args:
        data: one table (split by ``split_ratios`` in row order, after sorting by timestamp) or a DatasetDict that
            already has train/validation/test splits (kept as they are).
        timestamp_column: ``"auto"`` (a datetime column or one named date/datetime/timestamp/time/ds), a name, or
            ``None``. Kept as a timestamp column; Autoformer/Informer windows build time features from it.
        columns: the channels; default every numeric column except the timestamp and ``drop_columns``.
        drop_columns: columns to leave out.
    Returns:
        DatasetDict with the timestamp (if any) and float32 channels; missing values stay NaN (windows mask them).
        ``standardization_of(result)`` gives the statistics, to un-scale forecasts.
    """
    frames = _frames(data)
    first = frames if isinstance(frames, pd.DataFrame) else frames["train"]
    timestamp = _timestamp_column(first, timestamp_column)
    channels = _channels(first, columns, drop_columns, timestamp)
    if isinstance(frames, pd.DataFrame):
        frame = _parse_timestamps(frames, timestamp) if timestamp else frames
        train, validation, _ = split_sizes(len(frame), split_ratios)
        bounds = (0, train, train + validation, len(frame))
        frames = {name: frame.iloc[bounds[i] : bounds[i + 1]] for i, name in enumerate(SPLITS)}
    else:
        missing = {name: [c for c in channels if c not in f.columns] for name, f in frames.items()}
        if any(missing.values()):
            raise ValueError(f"the splits do not share the training split's channels; missing: {missing}")
        empty = [name for name, f in frames.items() if len(f) == 0]
        if empty:
            raise ValueError(f"split(s) {empty} have no rows; every one of {list(SPLITS)} needs data")
        frames = {name: _parse_timestamps(f, timestamp) if timestamp else f for name, f in frames.items()}
    values = {name: f[channels].to_numpy(dtype=np.float64) for name, f in frames.items()}
    stats = Standardization.fit(values["train"], channels, timestamp)
    splits = {}
    for name, frame in frames.items():
        table = pd.DataFrame(stats.apply(values[name]).astype(np.float32), columns=channels)
        if timestamp:
            table.insert(0, timestamp, frame[timestamp].to_numpy())
        info = datasets.DatasetInfo(description=stats.to_json())
        splits[name] = datasets.Dataset.from_pandas(table, info=info, preserve_index=False, split=name)
    return datasets.DatasetDict(splits)
