"""Classification data from a user's files (tiny synthetic ones): long and wide CSV, .ts, padding masks, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hf_tensorcompress.data.classification import SeriesColumns, describe_classification, load_classification_dataset


def long_table(series: int = 16, classes: int = 4) -> pd.DataFrame:
    """Two channels; series i has 5 + i % 3 steps and class i % classes."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(series):
        for t in range(5 + i % 3):
            rows.append(
                {
                    "series": f"s{i}",
                    "t": t,
                    "a": rng.normal() + i % classes,
                    "b": rng.normal(),
                    "label": f"c{i % classes}",
                }
            )
    return pd.DataFrame(rows)


def test_long_csv_pads_ragged_series_with_a_mask(tmp_path):
    path = tmp_path / "long.csv"
    long_table().sample(frac=1.0, random_state=0).to_csv(path, index=False)  # rows shuffled: --time-column orders them
    data = load_classification_dataset(str(path), columns=SeriesColumns("label", "series", "t"))
    assert {name: len(split) for name, split in data.items()} == {"train": 8, "validation": 4, "test": 4}
    train = data["train"].with_format("numpy")[:]
    assert train["past_values"].shape == (8, 7, 2)
    lengths = train["past_observed_mask"][:, :, 0].sum(axis=1)
    assert set(lengths) <= {5, 6, 7} and (train["past_values"][train["past_observed_mask"] == 0] == 0).all()
    assert data["train"].features["target_values"].names == ["c0", "c1", "c2", "c3"]
    assert "classes: 4" in describe_classification(data, str(path))


def test_wide_csv_and_ts_file(tmp_path):
    rng = np.random.default_rng(1)
    wide = pd.DataFrame(rng.normal(size=(12, 6)), columns=[f"t{i}" for i in range(6)])
    wide.iloc[0, 4:] = np.nan  # a shorter series
    wide["label"] = ["x", "y", "z"] * 4
    wide.to_csv(tmp_path / "wide.csv", index=False)
    data = load_classification_dataset(str(tmp_path / "wide.csv"), test_fraction=0.25, validation=0.25)
    assert data["train"].with_format("numpy")[0]["past_values"].shape == (6, 1)
    assert sum(len(split) for split in data.values()) == 12
    ts = tmp_path / "toy.ts"
    ts.write_text(
        "@problemName toy\n@timeStamps false\n@univariate true\n@classLabel true a b\n@data\n"
        + "".join(f"{','.join(str(v) for v in rng.normal(size=5))}:{'ab'[i % 2]}\n" for i in range(12))
    )
    assert len(load_classification_dataset(str(ts), validation=0.25)["test"]) == 4


def test_classification_errors_name_the_column_or_flag(tmp_path):
    table = long_table()
    path = tmp_path / "long.csv"
    table.assign(note="text").to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"\['note'\] are not numeric"):
        load_classification_dataset(str(path), columns=SeriesColumns("label", "series"))
    with pytest.raises(ValueError, match=r"label_column \(--label-column\): column\(s\) \['class'\] not found"):
        load_classification_dataset(table, columns=SeriesColumns("class", "series"))
    mixed = table.copy()
    mixed.loc[0, "label"] = "c3"
    with pytest.raises(ValueError, match="more than one 'label' value"):
        load_classification_dataset(mixed, columns=SeriesColumns("label", "series", "t"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_classification_dataset("missing/vowels.csv")
