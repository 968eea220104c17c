"""``Layout``: how to read one forecasting table (time axis, series id, targets, covariates, encodings) and ``tidy``,
which applies it, so that every source (CSV, Parquet, ``datasets``) is interpreted by the same rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from .columns import (
    COMBINED_TIMESTAMP,
    check_timestamps,
    combine_calendar_columns,
    is_numeric,
    not_numeric,
    one_hot,
    pivot_long,
    suspicious_channels,
    typed,
)

#: Column names taken as the timestamp when ``timestamp_column="auto"`` (case-insensitive).
TIMESTAMP_NAMES = ("date", "datetime", "timestamp", "time", "ds")


@dataclass(frozen=True)
class Layout:
    """How to read a table. ``columns``: the targets (default: every numeric column not otherwise used);
    ``covariates``: channels fed to the model but not scored; ``id_column``: long format, pivoted to one channel per
    series × value column; ``timestamp_columns``: calendar columns (year month day [hour ...]) combined into one."""

    timestamp_column: str | None = "auto"
    timestamp_columns: Sequence[str] | None = None
    id_column: str | None = None
    columns: Sequence[str] | None = None
    covariates: Sequence[str] = ()
    drop_columns: Sequence[str] = ()
    one_hot: Sequence[str] = ()
    sort_timestamps: bool = False


@dataclass(frozen=True)
class Tidy:
    """A table read by a ``Layout``: one row per time step; ``targets`` and ``covariates`` are the channels."""

    frame: pd.DataFrame
    timestamp: str | None
    targets: list[str]
    covariates: list[str]
    unused: list[str] = field(default_factory=list)

    @property
    def channels(self) -> list[str]:
        return [*self.targets, *self.covariates]


def timestamp_column(frame: pd.DataFrame, requested: str | None) -> str | None:
    """The requested column, or with ``"auto"`` the first datetime column, one with a usual date name, or the first
    text column of dates (the printed data summary names the column taken)."""
    if requested is None:
        return None
    if requested != "auto":
        if requested not in frame.columns:
            raise ValueError(
                f"timestamp_column={requested!r} is not a column (--timestamp-column); columns are "
                f"{list(frame.columns)} (pass timestamp_column=None for data without timestamps)"
            )
        return requested
    for name in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[name]) or str(name).lower() in TIMESTAMP_NAMES:
            return name
    return next((name for name in frame.columns if _holds_dates(frame[name])), None)


def _holds_dates(series: pd.Series) -> bool:
    """A text column whose first values all parse as dates (a CSV stores timestamps as text)."""
    if not (pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series)):
        return False
    sample = series.dropna().head(20)
    try:
        return len(sample) > 0 and pd.to_datetime(sample, format="mixed").notna().all()
    except (ValueError, TypeError):
        return False


def parse_timestamps(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    try:
        stamps = pd.to_datetime(frame[column])
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"timestamp column {column!r} does not parse as dates ({error}); name the right column with "
            "timestamp_column=... (--timestamp-column), combine calendar columns with timestamp_columns=[...] "
            "(--timestamp-columns year month day hour), or pass timestamp_column=None"
        ) from None
    return frame.assign(**{column: stamps.astype("datetime64[ns]")})


def _value_columns(
    frame: pd.DataFrame, layout: Layout, skip: set[str], timestamp: str | None, encoded: dict[str, list[str]]
) -> tuple[list[str], list[str]]:
    """(targets, covariates) as columns of ``frame`` (before any pivot). By default every numeric column not named
    otherwise is a target, except where that would score what is no series of the user's: a True/False column and
    the 0/1 columns ``encoded`` made (``{column: its new columns}``) are errors naming the flags that say what
    they are."""
    named = [*(layout.columns or []), *layout.covariates, *layout.drop_columns]
    unknown = [name for name in named if name not in frame.columns]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; the data's columns are {list(frame.columns)}")
    covariates = [name for name in layout.covariates if name not in layout.drop_columns]
    if layout.columns is not None:
        targets = [name for name in layout.columns if name not in layout.drop_columns]
        wrong = [name for name in [*targets, *covariates] if not is_numeric(frame[name])]
        if wrong:
            raise not_numeric(
                frame,
                wrong,
                f"forecasting channels must be numbers (encode categories with one_hot={wrong}, "
                f"--one-hot {typed(wrong)})",
            )
        return targets, covariates
    rest = [name for name in frame.columns if name not in skip | set(covariates) | set(layout.drop_columns)]
    if not any(is_numeric(frame[name]) for name in rest):
        raise ValueError(
            f"no numeric columns to forecast among {list(frame.columns)} (timestamp: {timestamp!r}, dropped: "
            f"{list(layout.drop_columns)}); pass columns=[...] (--target ...) naming numeric columns"
        )
    suspicious_channels(frame, [*rest, *covariates], timestamp)
    flags = [name for name in rest if pd.api.types.is_bool_dtype(frame[name])]
    if flags:
        per_series = f"; with id_column={layout.id_column!r}, one per series" if layout.id_column else ""
        raise ValueError(
            f"column(s) {flags} hold True/False, and every column not named otherwise becomes a scored target "
            f"channel{per_series}. Pass them as covariates={flags} (--covariates {typed(flags)}) and name the "
            f"targets with columns=[...] (--target ...), or leave them out with drop_columns={flags} "
            f"(--drop-columns {typed(flags)})"
        )
    sources = [source for source, new in encoded.items() if set(new) & set(rest)]
    if sources:
        made = [name for source in sources for name in encoded[source]]
        raise ValueError(
            f"one_hot={sources} (--one-hot {typed(sources)}) makes 0/1 columns {made[:4]}, and every column not "
            f"named otherwise becomes a scored target channel. Pass them as covariates={sources} (--covariates "
            f"{typed(sources)}), or name them among the targets with columns=[...] (--target ...)"
        )
    return rest, covariates


def _unused_columns(frame: pd.DataFrame, used: set[str]) -> list[str]:
    """Columns of the table that are neither the time axis, the series id, a target, a covariate nor dropped."""
    return [name for name in frame.columns if name not in used]


def _check_one_hot(encoded: dict[str, list[str]], channels: list[str]) -> None:
    """A one-hot encoded column must end up as a channel: encoding one that is left out is a mistake to report."""
    unused = [name for name, new in encoded.items() if not set(new) & set(channels)]
    if unused:
        raise ValueError(
            f"one_hot={unused} (--one-hot {typed(unused)}) encodes column(s) that are neither targets nor "
            f"covariates; add them to columns (--target) or covariates (--covariates), or do not encode them"
        )


def tidy(frame: pd.DataFrame, layout: Layout) -> Tidy:
    """Apply ``layout`` to one table: encode, build and check the time axis, pivot long data, pick channels."""
    encoded: dict[str, list[str]] = {}
    if layout.one_hot:
        frame, encoded = one_hot(frame, layout.one_hot)
        expand = lambda names: [new for name in names for new in encoded.get(name, [name])]  # noqa: E731
        layout = replace(
            layout,
            columns=None if layout.columns is None else expand(layout.columns),
            covariates=expand(layout.covariates),
            drop_columns=expand(layout.drop_columns),
        )
    if layout.timestamp_columns:
        if layout.timestamp_column not in (None, "auto"):
            raise ValueError(
                "pass either timestamp_column (--timestamp-column) or timestamp_columns (--timestamp-columns), not both"
            )
        frame = combine_calendar_columns(frame, layout.timestamp_columns)
        timestamp = COMBINED_TIMESTAMP
    else:
        timestamp = timestamp_column(frame, layout.timestamp_column)
    if timestamp:
        frame = parse_timestamps(frame, timestamp)
    skip = {name for name in (timestamp, layout.id_column) if name}
    if layout.id_column is not None:
        if layout.id_column not in frame.columns:
            raise ValueError(
                f"id_column={layout.id_column!r} (--id-column) is not a column; columns are {list(frame.columns)}"
            )
        targets, covariates = _value_columns(frame, layout, skip, timestamp, encoded)
        unused = _unused_columns(frame, skip | {*targets, *covariates, *layout.drop_columns})
        _check_one_hot(encoded, [*targets, *covariates])
        frame, names = pivot_long(frame, layout.id_column, timestamp, [*targets, *covariates])
        targets = [channel for name in targets for channel in names[name]]
        covariates = [channel for name in covariates for channel in names[name]]
    else:
        if timestamp:
            frame = check_timestamps(frame, timestamp, layout.sort_timestamps)
        targets, covariates = _value_columns(frame, layout, skip, timestamp, encoded)
        unused = _unused_columns(frame, skip | {*targets, *covariates, *layout.drop_columns})
        _check_one_hot(encoded, [*targets, *covariates])
    if not targets:
        raise ValueError("no target channels: columns=[] (--target) names none; name at least one numeric column")
    return Tidy(frame.reset_index(drop=True), timestamp, targets, covariates, unused)
