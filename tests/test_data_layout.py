"""A user's own forecasting tables (tiny synthetic files): calendar columns, long format, categories, row
counters, missing targets, ordering; every ambiguity is an error naming the column and what to pass."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction

from hf_tensorcompress.data import (
    describe_forecasting,
    forecasting_windows,
    load_forecasting_dataset,
    standardization_of,
)
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.evaluation.metrics import load_metric


def air_quality(rows: int = 120) -> pd.DataFrame:
    """Like the Beijing PM2.5 file: row counter, year/month/day/hour, a wind direction, missing targets."""
    stamps = pd.date_range("2014-01-01", periods=rows, freq="h")
    rng = np.random.default_rng(0)
    pm = rng.gamma(2.0, 40.0, rows)
    pm[[3, 4, 50]] = np.nan
    return pd.DataFrame(
        {
            "No": np.arange(1, rows + 1),
            "year": stamps.year,
            "month": stamps.month,
            "day": stamps.day,
            "hour": stamps.hour,
            "pm2.5": pm,
            "TEMP": rng.normal(0, 5, rows),
            "cbwd": rng.choice(["NW", "SE", "cv"], rows),
        }
    )


def write(frame: pd.DataFrame, tmp_path, name: str = "data.csv") -> str:
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return str(path)


def patchtst(channels: int, context: int = 16, horizon: int = 4) -> PatchTSTConfig:
    return PatchTSTConfig(
        num_input_channels=channels,
        context_length=context,
        prediction_length=horizon,
        patch_length=4,
        patch_stride=4,
        d_model=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=8,
    )


def test_calendar_columns_row_counter_and_category_need_flags(tmp_path):
    path = write(air_quality(), tmp_path)
    with pytest.raises(ValueError, match=r"\['cbwd'\] are not numeric.*--one-hot cbwd"):
        load_forecasting_dataset(path)
    with pytest.raises(ValueError, match=r"'No' counts rows.*--drop-columns No"):
        load_forecasting_dataset(path, one_hot=["cbwd"])
    with pytest.raises(ValueError, match=r"calendar fields.*--timestamp-columns year month day hour"):
        load_forecasting_dataset(path, one_hot=["cbwd"], drop_columns=["No"])
    data = load_forecasting_dataset(
        path,
        timestamp_columns=["year", "month", "day", "hour"],
        drop_columns=["No"],
        columns=["pm2.5"],
        covariates=["TEMP", "cbwd"],
        one_hot=["cbwd"],
    )
    stats = standardization_of(data)
    assert stats.timestamp_column == "timestamp" and stats.target_columns == ("pm2.5",)
    assert stats.columns == ("pm2.5", "TEMP", "cbwd=NW", "cbwd=SE", "cbwd=cv")
    stamps = data["train"].with_format("pandas")["timestamp"]
    assert stamps.iloc[1] - stamps.iloc[0] == pd.Timedelta(hours=1)
    summary = describe_forecasting(data, path)
    assert "frequency h" in summary.lower() and "covariates (inputs only): TEMP" in summary and "missing" in summary


def test_long_format_is_an_error_until_pivoted_by_its_id_column(tmp_path):
    stamps = pd.date_range("2024-01-01", periods=60, freq="30min")
    long = pd.concat(
        [
            pd.DataFrame({"ds": stamps, "unique_id": "demand", "y": np.arange(60.0)}),
            pd.DataFrame({"ds": stamps, "unique_id": "temperature", "y": -np.arange(60.0)}),
        ]
    )
    path = write(long, tmp_path)
    with pytest.raises(ValueError, match=r"'ds' repeats 60 time.*--id-column.*candidates: \['unique_id'\]"):
        load_forecasting_dataset(path)
    data = load_forecasting_dataset(path, id_column="unique_id", columns=["y"])
    stats = standardization_of(data)
    assert stats.columns == ("demand", "temperature")
    train = data["train"].to_pandas()
    assert len(train) == 42 and train["ds"].is_monotonic_increasing and not train["ds"].duplicated().any()
    raw = stats.inverse(train[["demand", "temperature"]].to_numpy())
    np.testing.assert_allclose(raw[:, 0], np.arange(42.0), atol=1e-4)
    np.testing.assert_allclose(raw[:, 1], -np.arange(42.0), atol=1e-4)
    # two value columns: one channel per series × value column; a duplicated (time, id) pair is an error
    two = long.assign(z=1.0)
    assert standardization_of(load_forecasting_dataset(two, id_column="unique_id")).columns == (
        "demand/y",
        "temperature/y",
        "demand/z",
        "temperature/z",
    )
    with pytest.raises(ValueError, match="series 'demand' has more than one row"):
        load_forecasting_dataset(pd.concat([long, long.iloc[:1]]), id_column="unique_id")


def test_unsorted_duplicated_and_short_data_are_errors(tmp_path):
    frame = pd.DataFrame({"date": pd.date_range("2024-01-01", periods=50, freq="D"), "v": np.arange(50.0)})
    with pytest.raises(ValueError, match=r"not in time order.*--sort-timestamps"):
        load_forecasting_dataset(frame.iloc[::-1])
    assert len(load_forecasting_dataset(frame.iloc[::-1], sort_timestamps=True)["train"]) == 35
    with pytest.raises(ValueError, match="'date' repeats 1 time"):
        load_forecasting_dataset(pd.concat([frame, frame.iloc[:1]]))
    data = load_forecasting_dataset(frame)
    with pytest.raises(ValueError, match=r"fewer than one window needs.*--horizon"):
        forecasting_windows(data["validation"], patchtst(1))
    with pytest.raises(ValueError, match=r"one_hot.*unknown column\(s\) \['wind'\]"):
        load_forecasting_dataset(frame, one_hot=["wind"])


def test_missing_file_is_reported_as_missing_not_as_a_hub_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="my_series.csv does not exist"):
        load_forecasting_dataset("my_series.csv")
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="not a readable table"):
        load_forecasting_dataset(str(tmp_path / "bad.csv"))


def test_metric_modules_skip_missing_references():
    predictions, references = [[1.0, 2.0, 3.0]], [[1.0, float("nan"), 5.0]]
    assert load_metric("mse").compute(predictions=predictions, references=references) == {"mse": 2.0}
    assert load_metric("mae").compute(predictions=predictions, references=references) == {"mae": 1.0}
    assert load_metric("accuracy").compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2]) == {"accuracy": 0.75}


def test_evaluation_masks_missing_targets_and_skips_covariates():
    stamps = pd.date_range("2024-01-01", periods=200, freq="h")
    target = np.sin(np.arange(200) / 5.0)
    target[150:200:3] = np.nan  # missing targets in the test split
    frame = pd.DataFrame({"date": stamps, "y": target, "x": np.cos(np.arange(200) / 7.0)})
    data = load_forecasting_dataset(frame, columns=["y"], covariates=["x"])
    config = patchtst(2)
    torch.manual_seed(0)
    model = PatchTSTForPrediction(config).eval()
    windows = forecasting_windows(data["test"], config, stride=3)
    scores = evaluate_forecaster(model, windows, progress=False)
    batch = torch.stack([windows[i]["past_values"] for i in range(len(windows))])
    observed = torch.stack([windows[i]["past_observed_mask"] for i in range(len(windows))])
    future = torch.stack([windows[i]["future_values"] for i in range(len(windows))])
    scored = torch.stack([windows.scored_mask(i) for i in range(len(windows))])
    assert not scored[..., 1].any() and not scored.all()  # covariate never scored; missing targets not scored
    with torch.no_grad():
        error = model(past_values=batch, past_observed_mask=observed).prediction_outputs - future
    assert scores["mse"] == pytest.approx(float(error[scored].pow(2).mean()), rel=1e-5)
    assert scores["mae"] == pytest.approx(float(error[scored].abs().mean()), rel=1e-5)
