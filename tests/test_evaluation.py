"""The shipped mse/mae evaluate modules (offline, by path) and evaluate_forecaster on real windows."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction

from hf_tensorcompress.data import forecasting_windows, load_appliances_energy
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.evaluation.metrics import load_metric, metric_path


def test_metric_modules_compute_mse_and_mae():
    rng = np.random.default_rng(0)
    predictions, references = rng.normal(size=(7, 12)), rng.normal(size=(7, 12))
    mse, mae = load_metric("mse"), load_metric("mae")
    for row in range(0, 7, 3):  # accumulated over batches like an evaluation loop does
        mse.add_batch(predictions=predictions[row : row + 3], references=references[row : row + 3])
        mae.add_batch(predictions=predictions[row : row + 3], references=references[row : row + 3])
    expected = predictions.astype(np.float32) - references.astype(np.float32)
    assert mse.compute()["mse"] == pytest.approx(np.mean(expected.astype(np.float64) ** 2), rel=1e-6)
    assert mae.compute()["mae"] == pytest.approx(np.mean(np.abs(expected.astype(np.float64))), rel=1e-6)
    assert load_metric("mse").compute(predictions=[1.0, 2.0], references=[1.0, 4.0]) == {"mse": 2.0}
    with pytest.raises(ValueError, match="shipped: \\['accuracy', 'mae', 'mse'"):
        metric_path("rmse")


def test_metric_loads_without_network():
    """``evaluate.load`` of the shipped folder must not open a single connection (no Hub at run time)."""
    script = textwrap.dedent(
        f"""
        import socket
        def refuse(*args, **kwargs):
            raise AssertionError("network access attempted")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        import evaluate
        metric = evaluate.load({str(metric_path("mae"))!r})
        print(metric.compute(predictions=[[0.0, 1.0]], references=[[1.0, 1.0]]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "{'mae': 0.5}" in result.stdout


def test_evaluate_forecaster_matches_direct_computation():
    data = load_appliances_energy()
    config = PatchTSTConfig(
        num_input_channels=26,
        context_length=32,
        prediction_length=8,
        patch_length=8,
        patch_stride=8,
        d_model=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
    )
    torch.manual_seed(0)
    model = PatchTSTForPrediction(config).train()
    windows = forecasting_windows(data["test"], config, stride=97)
    scores = evaluate_forecaster(model, windows, batch_size=16)
    assert model.training  # the caller's mode is restored
    model.eval()
    batch = {k: torch.stack([windows[i][k] for i in range(len(windows))]) for k in ("past_values", "future_values")}
    with torch.no_grad():
        error = model(past_values=batch["past_values"]).prediction_outputs - batch["future_values"]
    assert scores["mse"] == pytest.approx(float(error.pow(2).mean()), rel=1e-5)
    assert scores["mae"] == pytest.approx(float(error.abs().mean()), rel=1e-5)
