"""A short account of what was read, printed before training so a wrong reading is seen before it costs time."""

from __future__ import annotations

import datasets
import numpy as np
import pandas as pd

from .standardize import standardization_of


def frequency(stamps: pd.Series) -> str:
    """The pandas frequency alias of evenly spaced timestamps, else the spread of the steps (gaps, irregular data)."""
    if len(stamps) < 3:
        return "unknown (fewer than 3 steps)"
    inferred = pd.infer_freq(pd.DatetimeIndex(stamps))
    if inferred:
        return inferred
    steps = pd.Series(stamps).diff().dropna()
    return f"irregular: steps from {steps.min()} to {steps.max()} (most common {steps.mode().iloc[0]})"


def _names(names: list[str] | tuple[str, ...], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


#: Model types whose forecast of a channel is computed from that channel's history alone (PatchTST shares weights
#: across channels but never mixes them), so covariates cannot change the targets' forecast.
CHANNEL_INDEPENDENT = ("patchtst",)


def covariate_note(model_type: str, covariates: list[str]) -> str | None:
    """The line to print when ``covariates`` cannot influence the targets' forecast of a ``model_type`` model."""
    if model_type not in CHANNEL_INDEPENDENT or not covariates:
        return None
    return (
        f"note: {model_type} is channel-independent: each channel is forecast from its own history only, so the "
        f"{len(covariates)} covariate(s) do not influence the targets' forecast (they are forecast too, and not "
        "scored); autoformer or informer mixes channels and does use them"
    )


def describe_forecasting(data: datasets.DatasetDict, source: str, model_type: str | None = None) -> str:
    """Rows per split, channels (targets / covariates), time range, frequency and share of missing values; with
    ``model_type`` (the model the data is for), the note that a channel-independent model ignores covariates."""
    stats = standardization_of(data)
    frames = {name: split.with_format(None).to_pandas() for name, split in data.items()}
    values = np.concatenate([frame[list(stats.columns)].to_numpy(dtype=np.float64) for frame in frames.values()])
    missing = np.isnan(values).mean(axis=0)
    covariates = [name for name in stats.columns if name not in stats.target_columns]
    lines = [
        f"data: {source}",
        f"  rows: {sum(len(f) for f in frames.values())} ("
        + ", ".join(f"{name} {len(frame)}" for name, frame in frames.items())
        + ")",
        f"  channels: {len(stats.columns)}; targets (scored): {_names(list(stats.target_columns))}"
        + (f"; covariates (inputs only): {_names(covariates)}" if covariates else ""),
    ]
    if stats.unused:
        lines.append(
            f"  not used (no channel; name them with --target/--covariates to keep them): {_names(list(stats.unused))}"
        )
    if stats.timestamp_column:
        stamps = pd.concat([frame[stats.timestamp_column] for frame in frames.values()], ignore_index=True)
        lines.append(
            f"  time: {stamps.iloc[0]} to {stamps.iloc[-1]} (column {stats.timestamp_column!r}), "
            f"frequency {frequency(stamps)}"
        )
    else:
        lines.append("  time: no timestamp column (rows taken in file order)")
    worst = int(np.argmax(missing))
    lines.append(
        f"  missing: {np.isnan(values).mean():.2%} of values"
        + (
            f" (most: {stats.columns[worst]} {missing[worst]:.2%}); masked in training and in every metric"
            if missing[worst] > 0
            else ""
        )
    )
    note = covariate_note(model_type, covariates) if model_type else None
    return "\n".join(lines + ([note] if note else []))
