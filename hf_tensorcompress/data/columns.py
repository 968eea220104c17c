"""What each column of a forecasting table is: the time axis, a series id, a channel, or a mistake to report.

Every reinterpretation (combining calendar columns, pivoting long data, one-hot encoding) happens only when the
caller asks for it; anything ambiguous is an error that names the column and the argument (and recipe flag) to pass.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import pandas as pd

#: ``timestamp_columns`` are read in this order (year month day [hour [minute [second]]]).
CALENDAR_UNITS = ("year", "month", "day", "hour", "minute", "second")
#: Name of the timestamp built from ``timestamp_columns``.
COMBINED_TIMESTAMP = "timestamp"


def typed(names: Sequence[object]) -> str:
    """Column names as they are typed after a flag in a shell (``'Unnamed: 0'`` quoted), so a hint can be pasted."""
    return " ".join(shlex.quote(str(name)) for name in names)


def is_numeric(series: pd.Series) -> bool:
    """Numbers and booleans (0/1) can be channels; text, categories and dates cannot."""
    return pd.api.types.is_numeric_dtype(series)


def stray_text(frame: pd.DataFrame, names: Sequence[str]) -> str | None:
    """A message about the first of ``names`` that is not numeric only because a few cells are not numbers (a typo,
    "n/a"), naming the first bad cell and its row, or None when every non-numeric column is text throughout."""
    for name in names:
        series = frame[name]
        if is_numeric(series):
            continue
        parsed = pd.to_numeric(series, errors="coerce")
        bad = series.notna() & parsed.isna()
        if parsed.notna().any() and bad.any():
            row = bad.to_numpy().argmax()
            return (
                f"column {name!r} holds numbers except {int(bad.sum())} cell(s), e.g. {series[bad].iloc[0]!r} in data "
                f"row {row} (line {row + 2} of a CSV with a header); correct the cell, or leave it empty: an empty "
                "cell is a missing value, which is masked"
            )
    return None


def not_numeric(frame: pd.DataFrame, names: Sequence[str], advice: str) -> ValueError:
    """The error for columns ``names`` that are not numeric: a stray bad cell is named with its row; a text column
    is shown with one of its text cells and ``advice`` (what to do with a categorical column)."""
    stray = stray_text(frame, names)
    if stray:
        return ValueError(stray)
    example = next((frame[n].dropna().iloc[0] for n in names if frame[n].notna().any()), None)
    return ValueError(f"column(s) {list(names)[:5]} are not numeric (e.g. {example!r}); {advice}")


def combine_calendar_columns(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Replace calendar columns (year, month, day[, hour[, minute[, second]]] in that order) by one timestamp."""
    unknown = [name for name in columns if name not in frame.columns]
    if unknown:
        raise ValueError(
            f"timestamp_columns (--timestamp-columns): unknown column(s) {unknown}; columns are {list(frame.columns)}"
        )
    if not 3 <= len(columns) <= len(CALENDAR_UNITS):
        raise ValueError(
            f"timestamp_columns={list(columns)} (--timestamp-columns) must name 3 to 6 columns in the order "
            f"{' '.join(CALENDAR_UNITS)}"
        )
    if COMBINED_TIMESTAMP in frame.columns and COMBINED_TIMESTAMP not in columns:
        raise ValueError(f"the data already has a column {COMBINED_TIMESTAMP!r}; pass it as timestamp_column instead")
    parts = frame[list(columns)].set_axis(CALENDAR_UNITS[: len(columns)], axis=1)
    try:
        stamps = pd.to_datetime(parts)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"timestamp_columns={list(columns)} do not form dates when read as {' '.join(CALENDAR_UNITS[: len(columns)])} "
            f"({error})"
        ) from None
    return frame.drop(columns=list(columns)).assign(**{COMBINED_TIMESTAMP: stamps})


def one_hot(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Each named categorical column becomes one 0/1 column per value, named ``column=value`` (missing stays NaN).
    Returns the frame and, per encoded column, the names of its new columns."""
    unknown = [name for name in columns if name not in frame.columns]
    if unknown:
        raise ValueError(f"one_hot (--one-hot): unknown column(s) {unknown}; columns are {list(frame.columns)}")
    names = {}
    for name in columns:
        values = frame[name]
        dummies = pd.get_dummies(values, prefix=name, prefix_sep="=", dtype=float)
        dummies[values.isna()] = float("nan")
        frame = pd.concat([frame.drop(columns=[name]), dummies], axis=1)
        names[name] = list(dummies.columns)
    return frame, names


def id_candidates(frame: pd.DataFrame, timestamp: str) -> list[str]:
    """Columns that could name the series of long-format data: few distinct values, repeated at every time."""
    counts = frame[timestamp].value_counts()
    repeats = int(counts.max())
    return [
        name
        for name in frame.columns
        if name != timestamp
        and 1 < frame[name].nunique() <= repeats
        and frame[name].nunique() < len(frame) // 2
        and not pd.api.types.is_float_dtype(frame[name])
    ]


def check_timestamps(frame: pd.DataFrame, timestamp: str, sort: bool) -> pd.DataFrame:
    """No missing or duplicated timestamps; rows in time order (sorted only when ``sort``)."""
    stamps = frame[timestamp]
    if stamps.isna().any():
        raise ValueError(
            f"timestamp column {timestamp!r} has {int(stamps.isna().sum())} empty value(s), e.g. row {int(stamps.isna().to_numpy().argmax())}"
        )
    duplicated = stamps[stamps.duplicated()]
    if len(duplicated):
        candidates = id_candidates(frame, timestamp)
        hint = f"; candidates: {candidates}" if candidates else ""
        raise ValueError(
            f"timestamp column {timestamp!r} repeats {len(duplicated)} time(s) (e.g. {duplicated.iloc[0]}). If the file "
            f"stacks several series (long format), name the series column with id_column=... (--id-column COLUMN)"
            f"{hint}; otherwise remove the duplicated rows"
        )
    if not stamps.is_monotonic_increasing:
        if not sort:
            position = int((stamps.diff() < pd.Timedelta(0)).to_numpy().argmax())
            raise ValueError(
                f"timestamp column {timestamp!r} is not in time order (row {position}: {stamps.iloc[position]} after "
                f"{stamps.iloc[position - 1]}); sort the file, or pass sort_timestamps=True (--sort-timestamps)"
            )
        frame = frame.sort_values(timestamp, kind="stable").reset_index(drop=True)
    return frame


def pivot_long(
    frame: pd.DataFrame, id_column: str, timestamp: str | None, values: Sequence[str]
) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Long data (one row per time and series) -> one row per time, one channel per series × value column.

    Channels are named ``<id>`` (one value column) or ``<id>/<value column>``. Returns the wide frame and, for each
    value column, the channels made from it. A time at which a series has no row becomes a missing value.
    """
    if id_column not in frame.columns:
        raise ValueError(f"id_column={id_column!r} (--id-column) is not a column; columns are {list(frame.columns)}")
    if timestamp is None:
        raise ValueError(
            f"id_column={id_column!r} needs a timestamp column to align the series; name it with timestamp_column"
        )
    pairs = frame.duplicated([timestamp, id_column])
    if pairs.any():
        row = frame[pairs].iloc[0]
        raise ValueError(
            f"series {row[id_column]!r} has more than one row at {row[timestamp]} ({int(pairs.sum())} duplicated "
            f"({timestamp!r}, {id_column!r}) pairs); remove the duplicates"
        )
    wide = frame.pivot(index=timestamp, columns=id_column, values=list(values))
    names = {}
    channels = []
    for value in values:
        names[value] = [str(series) if len(values) == 1 else f"{series}/{value}" for series in wide[value].columns]
        channels.append(wide[value].set_axis(names[value], axis=1))
    return pd.concat(channels, axis=1).reset_index(), names


def suspicious_channels(frame: pd.DataFrame, candidates: Sequence[str], timestamp: str | None) -> None:
    """Errors for columns that would silently become channels by default: text, row counters, calendar fields."""
    text = [name for name in candidates if not is_numeric(frame[name])]
    if text:
        raise not_numeric(
            frame,
            text,
            f"encode them with one_hot={text} (--one-hot {typed(text)}) or leave them out with "
            f"drop_columns={text} (--drop-columns {typed(text)})",
        )
    for name in candidates:
        series = frame[name]
        if pd.api.types.is_integer_dtype(series) and len(series) > 2 and (series.diff().iloc[1:] == 1).all():
            raise ValueError(
                f"column {name!r} counts rows ({', '.join(str(v) for v in series.iloc[:3])}, ...), it is not a series to "
                f"forecast; leave it out with drop_columns=[{name!r}] (--drop-columns {typed([name])}) or name the channels "
                f"with columns=[...] (--target ...)"
            )
    calendar = [name for name in candidates if str(name).lower() in CALENDAR_UNITS]
    if timestamp is None and len(calendar) >= 2:
        raise ValueError(
            f"no timestamp column, but {calendar} look like calendar fields; combine them into the time axis with "
            f"timestamp_columns={calendar} (--timestamp-columns {typed(calendar)}), in the order "
            f"{' '.join(CALENDAR_UNITS)}"
        )
