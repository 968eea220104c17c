"""A numeric column with one cell that is not a number is reported with that cell and its row, and the advice to
correct it or leave it empty (not to one-hot encode a numeric column), by the forecasting and classification readers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hf_tensorcompress.data import load_forecasting_dataset
from hf_tensorcompress.data.classification import SeriesColumns, load_classification_dataset

ADVICE = r"correct the cell, or leave it empty"


def with_bad_cell(frame: pd.DataFrame, column: str, row: int) -> pd.DataFrame:
    frame = frame.astype({column: object})
    frame.loc[row, column] = "oops"
    return frame


def test_forecasting_names_the_bad_cell_and_its_row(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "date": pd.date_range("2024-01-01", periods=60, freq="h").astype(str),
            "load": rng.normal(size=60),
            "temp": rng.normal(size=60),
        }
    )
    path = tmp_path / "series.csv"
    with_bad_cell(frame, "temp", 7).to_csv(path, index=False)
    with pytest.raises(
        ValueError,
        match=rf"column 'temp' holds numbers except 1 cell\(s\), e.g. 'oops' in data row 7 "
        rf"\(line 9 .*{ADVICE}",
    ) as raised:
        load_forecasting_dataset(str(path))
    assert "one_hot" not in str(raised.value)


def test_classification_names_the_bad_cell_and_its_row(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "series": [f"s{i // 6}" for i in range(72)],
            "t": [i % 6 for i in range(72)],
            "a": rng.normal(size=72),
            "label": [f"c{i // 6 % 3}" for i in range(72)],
        }
    )
    path = tmp_path / "long.csv"
    with_bad_cell(frame, "a", 11).to_csv(path, index=False)
    with pytest.raises(
        ValueError, match=rf"column 'a' holds numbers except 1 cell\(s\), e.g. 'oops' in data row 11.*{ADVICE}"
    ):
        load_classification_dataset(str(path), columns=SeriesColumns("label", "series", "t"))


def test_a_text_column_still_gets_the_encoding_advice(tmp_path):
    frame = pd.DataFrame(
        {
            "date": pd.date_range("2024-01-01", periods=40, freq="h").astype(str),
            "load": np.arange(40.0) ** 0.5,
            "wind": ["NE", "SW"] * 20,
        }
    )
    with pytest.raises(ValueError, match=r"\['wind'\] are not numeric \(e.g. 'NE'\).*--one-hot wind"):
        load_forecasting_dataset(frame)
