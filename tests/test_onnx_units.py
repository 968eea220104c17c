"""An exported forecaster takes and returns values in the user's units: raw CSV values in, a forecast in the CSV's
units out, equal to the PyTorch model run on the standardised window and mapped back. The training statistics travel
with the model (``standardization.json``: the recipes write it, ``compress`` copies it, ``export-onnx`` puts it in the
graph and says so in the metadata)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress.cli import main
from hf_tensorcompress.data import load_forecasting_csv, standardization_of
from hf_tensorcompress.deploy.onnx.errors import OnnxExportError
from hf_tensorcompress.deploy.onnx.units import AS_TRAINED, in_user_units, read_statistics
from hf_tensorcompress.loading import load_model

runner = pytest.importorskip("hf_tensorcompress.deploy.onnx.runner")


def user_csv(path) -> pd.DataFrame:
    """Three channels far from standardised: a load around 1,000, a temperature around 20, a price around 0.3."""
    rng = np.random.default_rng(0)
    hours = np.arange(240)
    frame = pd.DataFrame(
        {
            "date": pd.date_range("2024-01-01", periods=len(hours), freq="h"),
            "load": 1000 + 80 * np.sin(hours / 24 * 2 * np.pi) + rng.normal(0, 5, len(hours)),
            "temp": 20 + 6 * np.cos(hours / 24 * 2 * np.pi) + rng.normal(0, 0.5, len(hours)),
            "price": 0.3 + 0.05 * rng.standard_normal(len(hours)),
        }
    )
    frame.to_csv(path, index=False)
    return frame


def test_raw_csv_values_give_a_forecast_in_the_csvs_units(tmp_path, capsys):
    frame = user_csv(tmp_path / "mine.csv")
    stats = standardization_of(load_forecasting_csv(tmp_path / "mine.csv"))
    torch.manual_seed(0)
    dense = tmp_path / "dense"
    PatchTSTForPrediction(tiny_patchtst_config(num_input_channels=3)).eval().save_pretrained(dense)
    (dense / "standardization.json").write_text(stats.to_json())  # as the recipes save it
    assert main(["compress", str(dense), str(tmp_path / "svd"), "--method", "svd", "--rank", "0.5"]) == 0
    assert (tmp_path / "svd" / "standardization.json").read_text() == stats.to_json()  # compress keeps it
    assert main(["export-onnx", str(tmp_path / "svd"), str(tmp_path / "svd.onnx")]) == 0
    assert "values in and out: yours" in capsys.readouterr().err

    session = runner.load(tmp_path / "svd.onnx")
    info = runner.metadata(session)
    assert info["units"].startswith("yours") and info["standardization"]["columns"] == list(stats.columns)
    context = info["context_length"]
    raw = frame[list(stats.columns)].to_numpy(np.float32)[-context:]  # the CSV's last rows, as they are
    forecast = runner.forecast(session, raw[None])[0]

    model = load_model(tmp_path / "svd")
    with torch.no_grad():
        standardised = torch.tensor(stats.apply(raw), dtype=torch.float32)[None]
        expected = stats.inverse(model(past_values=standardised).prediction_outputs[0].numpy())
    np.testing.assert_allclose(forecast, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert abs(forecast[:, 0].mean() - 1000) < 300  # the load's forecast is in the load's units


def test_without_statistics_the_metadata_says_values_are_the_models_own():
    model = PatchTSTForPrediction(tiny_patchtst_config(num_input_channels=3)).eval()
    graph = torch.nn.Identity()
    metadata = {"kind": "forecast", "architecture": "PatchTSTForPrediction", "inputs": ["past_values"]}
    assert in_user_units(graph, model, metadata, {}, None) == (graph, {}, {**metadata, "units": AS_TRAINED})
    wrong = {"columns": ["a", "b"], "mean": [0.0, 1.0], "std": [1.0, 2.0]}
    with pytest.raises(OnnxExportError, match="holds 2 channels .* the model takes 3"):
        in_user_units(graph, model, metadata, {}, wrong)


def test_the_statistics_are_read_as_the_data_pipeline_writes_them(tmp_path):
    user_csv(tmp_path / "mine.csv")
    stats = standardization_of(load_forecasting_csv(tmp_path / "mine.csv"))
    (tmp_path / "standardization.json").write_text(stats.to_json())
    expected = {"columns": list(stats.columns), "mean": list(stats.mean), "std": list(stats.std)}
    assert read_statistics(tmp_path) == read_statistics(None, stats) == expected
    assert read_statistics(None, json.loads(stats.to_json())) == expected
    assert read_statistics(tmp_path / "elsewhere") is None
    with pytest.raises(OnnxExportError, match="'std' must be positive"):
        read_statistics(None, {**expected, "std": [1.0, 0.0, 1.0]})


@pytest.mark.slow  # an Informer export takes tens of seconds; the fast tier exports a PatchTST above
def test_informers_fed_back_forecast_stays_in_the_users_units(tmp_path):
    """Informer's runner feeds each step's forecast back as ``future_values``: with the statistics in the graph the
    fed-back values are in the user's units too, and the forecast equals PyTorch's on the standardised inputs."""
    from onnx_cases import saved_seq2seq, seq2seq_inputs, torch_seq2seq_forecast

    from hf_tensorcompress.deploy.onnx import export_onnx

    folder = saved_seq2seq(tmp_path / "informer", "informer", {"method": "svd", "rank": 0.5})
    statistics = {"columns": ["a", "b"], "mean": [500.0, -3.0], "std": [40.0, 0.5]}
    path = export_onnx(folder, tmp_path / "informer.onnx", standardization=statistics)
    standardised = seq2seq_inputs(folder, batch=2, seed=0)
    mean, std = np.asarray(statistics["mean"], np.float32), np.asarray(statistics["std"], np.float32)
    raw = {**standardised, "past_values": standardised["past_values"] * std + mean}
    got = runner.forecast(runner.load(path, threads=1), **raw)
    expected = torch_seq2seq_forecast(folder, standardised) * std + mean
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
