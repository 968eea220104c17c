"""Time-series classification data as a ``DatasetDict`` of padded series, from any of the forms users have it in.

Sources: a UEA/UCR name (aeon's copy), a ``.ts`` or ``.arff`` file, a CSV/Parquet table (long: one row per time
step with a series id column; wide: one row per series), or a ``datasets`` folder/id holding such a table. Series of
different lengths are padded at the end; ``past_observed_mask`` is 0 on padding and on missing values, so the
model (PatchTST takes the mask) never sees them as data. Channels are standardised with the training split only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pandas as pd

from ..core.extras import require
from .columns import not_numeric
from .tables import looks_like_path, read_table

SERIES_FORMATS = (".ts", ".arff")
INFO_KEY = "hf_tensorcompress.classification"


@dataclass(frozen=True)
class RawSeries:
    """Series as read: one (channels, steps) array each (steps may differ), a label each, the channel names."""

    series: list[np.ndarray]
    labels: list[str]
    channels: list[str]

    def select(self, indices: Sequence[int]) -> RawSeries:
        return RawSeries([self.series[i] for i in indices], [self.labels[i] for i in indices], self.channels)


@dataclass(frozen=True)
class SeriesColumns:
    """Which columns of a table hold what: the class label, the series id (long format), the time order."""

    label_column: str = "label"
    id_column: str | None = None
    time_column: str | None = None


def _from_aeon(x, y) -> RawSeries:
    series = [np.asarray(s, dtype=np.float64) for s in x]  # a 3D array or a list of 2D arrays: (channels, steps)
    return RawSeries(series, [str(label) for label in y], [f"dim_{i}" for i in range(series[0].shape[0])])


def _from_long(frame: pd.DataFrame, columns: SeriesColumns) -> RawSeries:
    """One row per (series, time step); the label must be the same on every row of a series."""
    if columns.time_column is not None:
        _require(frame, [columns.time_column], "time_column (--time-column)")
        frame = frame.sort_values([columns.id_column, columns.time_column], kind="stable")
    channels = [c for c in frame.columns if c not in (columns.label_column, columns.id_column, columns.time_column)]
    _numeric(frame, channels)
    groups = frame.groupby(columns.id_column, sort=False)
    mixed = [key for key, labels in groups[columns.label_column] if labels.nunique() > 1]
    if mixed:
        raise ValueError(
            f"series {mixed[:3]} have more than one {columns.label_column!r} value; each series (id_column "
            f"{columns.id_column!r}) needs one label"
        )
    series = [group[channels].to_numpy(np.float64).T for _, group in groups]
    labels = [str(group[columns.label_column].iloc[0]) for _, group in groups]
    return RawSeries(series, labels, channels)


def _from_wide(frame: pd.DataFrame, columns: SeriesColumns) -> RawSeries:
    """One row per series, one column per time step (univariate); trailing empty cells shorten a series."""
    steps = [c for c in frame.columns if c != columns.label_column]
    _numeric(frame, steps)
    values = frame[steps].to_numpy(np.float64)
    lengths = [int(np.flatnonzero(~np.isnan(row))[-1]) + 1 if (~np.isnan(row)).any() else 0 for row in values]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise ValueError(f"row(s) {empty[:5]} hold no values")
    series = [row[None, :n] for row, n in zip(values, lengths)]
    return RawSeries(series, [str(v) for v in frame[columns.label_column]], ["value"])


def _require(frame: pd.DataFrame, names: Sequence[str], what: str) -> None:
    missing = [name for name in names if name not in frame.columns]
    if missing:
        raise ValueError(f"{what}: column(s) {missing} not found; columns are {list(frame.columns)}")


def _numeric(frame: pd.DataFrame, names: Sequence[str]) -> None:
    text = [name for name in names if not pd.api.types.is_numeric_dtype(frame[name])]
    if text:
        raise not_numeric(
            frame,
            text,
            "every column besides the label, id and time columns must be a number (name the series "
            "column with --id-column, the time column with --time-column)",
        )


def _from_table(frame: pd.DataFrame, columns: SeriesColumns) -> RawSeries:
    _require(frame, [columns.label_column], "label_column (--label-column)")
    if frame[columns.label_column].isna().any():
        raise ValueError(
            f"label column {columns.label_column!r} has {int(frame[columns.label_column].isna().sum())} empty value(s)"
        )
    if columns.id_column is None:
        return _from_wide(frame, columns)
    _require(frame, [columns.id_column], "id_column (--id-column)")
    return _from_long(frame, columns)


def read_series(source: str | Path | pd.DataFrame | datasets.Dataset, columns: SeriesColumns) -> dict[str, RawSeries]:
    """``{"train": ..., "test": ...}`` when the source comes split (UEA, a DatasetDict with both), else ``{"all": ...}``."""
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if path.is_file() and path.suffix.lower() in SERIES_FORMATS:
            loaders = require("aeon.datasets", "reading .ts/.arff files")
            reader = loaders.load_from_ts_file if path.suffix.lower() == ".ts" else loaders.load_from_arff_file
            try:
                return {"all": _from_aeon(*reader(str(path)))}
            except (OSError, ValueError, IndexError) as error:
                raise ValueError(f"{path} is not a readable {path.suffix} file: {error}") from None
        if not path.exists() and not looks_like_path(str(source)) and str(source).isidentifier():
            return _uea(str(source))
    table = read_table(source)
    if isinstance(table, datasets.DatasetDict):
        if {"train", "test"} <= set(table):
            return {name: _from_table(table[name].to_pandas(), columns) for name in ("train", "test")}
        table = datasets.concatenate_datasets(list(table.values()))
    frame = table.to_pandas() if isinstance(table, datasets.Dataset) else table
    return {"all": _from_table(frame, columns)}


def _uea(name: str) -> dict[str, RawSeries]:
    load_classification = require("aeon.datasets", "the UEA classification data").load_classification
    try:
        return {split: _from_aeon(*load_classification(name, split=split)) for split in ("train", "test")}
    except Exception as error:  # noqa: BLE001  (aeon raises OSError/ValueError/URLError for an unknown or unreachable name)
        raise ValueError(
            f"{name!r} is not a file here, and aeon could not load it as a UEA/UCR dataset ({type(error).__name__}: "
            f"{' '.join(str(error).split())[:200]}); pass a .ts/.arff/CSV file or a UEA name aeon has"
        ) from None


def stratified_split(labels: Sequence[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out) indices; each class gives ``round(fraction · count)`` series (at least 1) to held out."""
    if not 0 < fraction < 1:
        raise ValueError(f"split fraction {fraction} must be in (0, 1)")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held = []
    for label in sorted(set(labels)):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            raise ValueError(
                f"class {label!r} has {len(members)} series; each class needs 2 or more to split off a held-out part"
            )
        held.append(rng.permutation(members)[: max(1, round(fraction * len(members)))])
    held = np.sort(np.concatenate(held))
    return np.setdiff1d(np.arange(len(labels)), held), held


def _padded(raw: RawSeries, steps: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.zeros((len(raw.series), steps, len(raw.channels)), np.float64)
    observed = np.zeros_like(values)
    for i, series in enumerate(raw.series):
        if series.shape[0] != len(raw.channels):
            raise ValueError(f"series {i} has {series.shape[0]} channels, the first has {len(raw.channels)}")
        part = series.T[:steps]
        values[i, : len(part)] = np.nan_to_num(part)
        observed[i, : len(part)] = ~np.isnan(part)
    return values, observed


def load_classification_dataset(
    source: str | Path | pd.DataFrame | datasets.Dataset,
    *,
    test_source: str | Path | pd.DataFrame | None = None,
    columns: SeriesColumns = SeriesColumns(),
    length: int | None = None,
    validation: float = 0.2,
    test_fraction: float = 0.25,
    seed: int = 0,
) -> datasets.DatasetDict:
    """train/validation/test of padded, standardised series for ``PatchTSTForClassification``.

    Columns: ``past_values`` (steps, channels) float32, ``past_observed_mask`` (1 = a value, 0 = padding or
    missing), ``target_values`` (a ``ClassLabel``). The test split is the source's own (UEA, a DatasetDict with
    ``test``), ``test_source``, or a stratified ``test_fraction`` of the data; validation is a stratified
    ``validation`` fraction of train (model selection only).
    """
    parts = read_series(source, columns)
    if test_source is not None:
        if "test" in parts:
            raise ValueError(f"{source} already has a test split; leave out the test source (--test-dataset)")
        parts = {"train": parts["all"], "test": read_series(test_source, columns)["all"]}
    elif "all" in parts:
        kept, held = stratified_split(parts["all"].labels, test_fraction, seed)
        parts = {"train": parts["all"].select(kept), "test": parts["all"].select(held)}
    train, test = parts["train"], parts["test"]
    if test.channels != train.channels:
        raise ValueError(f"the test data has channels {test.channels}, the training data {train.channels}")
    unknown = sorted(set(test.labels) - set(train.labels))
    if unknown:
        raise ValueError(f"test labels {unknown[:5]} never occur in the training data")
    fit, held = stratified_split(train.labels, validation, seed)
    splits = {"train": train.select(fit), "validation": train.select(held), "test": test}
    steps = length or max(s.shape[1] for part in splits.values() for s in part.series)
    arrays = {name: _padded(part, steps) for name, part in splits.items()}
    values, observed = arrays["train"]
    count = observed.sum(axis=(0, 1))
    mean = (values * observed).sum(axis=(0, 1)) / np.maximum(count, 1)
    std = np.sqrt((((values - mean) * observed) ** 2).sum(axis=(0, 1)) / np.maximum(count, 1))
    std = np.where(std > 0, std, 1.0)
    classes = sorted(set(train.labels))
    features = datasets.Features(
        {
            "past_values": datasets.Array2D((steps, len(train.channels)), "float32"),
            "past_observed_mask": datasets.Array2D((steps, len(train.channels)), "float32"),
            "target_values": datasets.ClassLabel(names=classes),
        }
    )
    description = json.dumps({INFO_KEY: {"channels": train.channels, "mean": mean.tolist(), "std": std.tolist()}})
    result = {}
    for name, part in splits.items():
        values, observed = arrays[name]
        scaled = ((values - mean) / std * observed).astype(np.float32)  # padding and missing values stay exactly 0
        data = {
            "past_values": scaled,
            "past_observed_mask": observed.astype(np.float32),
            "target_values": [classes.index(label) for label in part.labels],
        }
        info = datasets.DatasetInfo(description=description, features=features)
        result[name] = datasets.Dataset.from_dict(data, features=features, info=info, split=name)
    return datasets.DatasetDict(result)


def describe_classification(data: datasets.DatasetDict, source: str) -> str:
    """Series per split, channels, length, classes (with training counts) and the share of padding/missing values."""
    train = data["train"].with_format("numpy")[:]
    channels = json.loads(data["train"].info.description)[INFO_KEY]["channels"]
    classes = data["train"].features["target_values"].names
    counts = np.bincount(train["target_values"], minlength=len(classes))
    lengths = train["past_observed_mask"].any(axis=2).sum(axis=1)
    observed = np.concatenate([data[name].with_format("numpy")[:]["past_observed_mask"].ravel() for name in data])
    shown = ", ".join(f"{name} {count}" for name, count in zip(classes[:10], counts[:10]))
    return "\n".join(
        [
            f"data: {source}",
            "  series: " + ", ".join(f"{name} {len(split)}" for name, split in data.items()),
            f"  channels: {len(channels)} ({', '.join(channels[:8])}{', …' if len(channels) > 8 else ''}); padded length "
            f"{train['past_values'].shape[1]} (training series {int(lengths.min())} to {int(lengths.max())} steps)",
            f"  classes: {len(classes)} (training series per class: {shown}{', …' if len(classes) > 10 else ''})",
            f"  padding or missing: {1 - observed.mean():.2%} of values (masked)",
        ]
    )
