"""Anomaly-detection series: KDD-TSAD_135 (aeon) by default, or a CSV with a 0/1 ``label`` column; benign data to
train and validate on, labelled data to test, standardised with the training part only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.extras import require
from .columns import not_numeric
from .tables import read_table


def _standardise(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return [((x - mean) / std).astype(np.float32) for x in (train, *others)]


def load_anomaly_series(
    source: str | Path | None, window: int, validation: float, label_column: str = "label"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(fit, validation, test, test_labels)`` arrays of (steps, channels).

    aeon's KDD-TSAD_135 brings a benign training series; for a CSV the benign part is the first half of the stretch
    before the first labelled anomaly (a third of the series if it starts with one). Validation and test keep
    ``window - 1`` steps of context before their first scored step.
    """
    if source is None:
        load_kdd_tsad_135 = require("aeon.datasets", "the KDD-TSAD anomaly data").load_kdd_tsad_135
        benign, _ = load_kdd_tsad_135(split="train")
        series, labels = load_kdd_tsad_135(split="test")
        test, test_labels = series[len(benign) - window + 1 :], labels[len(benign) - window + 1 :]
    else:
        frame = read_table(source)
        if not isinstance(frame, pd.DataFrame):
            frame = frame.to_pandas() if hasattr(frame, "to_pandas") else frame["train"].to_pandas()
        if label_column not in frame.columns:
            raise ValueError(
                f"{source} has no {label_column!r} column (0/1 per step); columns are {list(frame.columns)}"
            )
        labels_all = frame.pop(label_column).to_numpy()
        text = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
        if text:
            raise not_numeric(frame, text, f"drop them from {source}")
        values = frame.to_numpy(np.float32)
        benign_end = int(np.argmax(labels_all > 0) * 0.5) or len(values) // 3
        benign, test, test_labels = values[:benign_end], values[benign_end:], labels_all[benign_end:]
    benign = np.asarray(benign, np.float32).reshape(len(benign), -1)
    test = np.asarray(test, np.float32).reshape(len(test), -1)
    cut = int((1 - validation) * len(benign))
    fit, val, test = _standardise(benign[:cut], benign[cut - window + 1 :], test)
    return fit, val, test, np.asarray(test_labels).astype(int)
