"""Smoke run of recipes/cp_compress.py (tiny model, few steps) on a CSV cut from the real Appliances data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModel

from hf_tensorcompress.assets import appliances_energy_csv
from hf_tensorcompress.data import forecasting_windows, load_forecasting_csv

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_recipe_trains_compresses_evaluates_and_saves(tmp_path):
    csv = tmp_path / "energy.csv"
    pd.read_csv(appliances_energy_csv()).iloc[:2000][["date", "Appliances", "T1", "RH_1", "T_out"]].to_csv(
        csv, index=False
    )
    output = tmp_path / "out"
    command = [
        sys.executable,
        str(ROOT / "recipes" / "cp_compress.py"),
        "--dataset",
        str(csv),
        "--horizon",
        "12",
        "--context-length",
        "48",
        "--patch-length",
        "8",
        "--d-model",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--max-steps",
        "3",
        "--finetune-steps",
        "2",
        "--batch-size",
        "8",
        "--train-stride",
        "20",
        "--eval-stride",
        "10",
        "--output-dir",
        str(output),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| dense |" in result.stdout and "fine-tuned |" in result.stdout

    results = json.loads((output / "results.json").read_text())
    assert results["dataset"] == str(csv) and results["horizon"] == 12
    assert [run["name"] for run in results["runs"]] == [
        "dense",
        "dense, +2 steps",
        "cp rank=0.5, no fine-tune",
        "cp rank=0.5, fine-tuned",
    ]
    dense, control, _, tuned = results["runs"]
    assert control["train_seconds"] > 0 and dense["train_seconds"] > 0
    assert {"name", "metrics", "params", "attention_params", "train_seconds"} <= set(tuned)
    assert tuned["attention_params"] <= 0.55 * dense["attention_params"]
    assert tuned["params"] < dense["params"]
    assert all(run["metrics"]["mse"] > 0 and run["metrics"]["mae"] > 0 for run in results["runs"])

    # the saved checkpoint reloads as the compressed model and reproduces the reported test MSE
    model = AutoModel.from_pretrained(output, trust_remote_code=True).eval()
    assert model.config.compression_config["method"] == "cp"
    assert sum(p.numel() for p in model.parameters()) == tuned["params"]
    data = load_forecasting_csv(csv)
    windows = forecasting_windows(data["test"], model.config, stride=10)
    batch = {k: torch.stack([windows[i][k] for i in range(len(windows))]) for k in ("past_values", "future_values")}
    with torch.no_grad():
        error = model(past_values=batch["past_values"]).prediction_outputs - batch["future_values"]
    assert abs(float(error.pow(2).mean()) - tuned["metrics"]["mse"]) < 1e-5


def test_recipe_starts_from_a_pretrained_checkpoint(tmp_path, capsys):
    """``--model DIR``: lengths come from the checkpoint, dense training can be skipped, SVD works too."""
    import importlib.util

    from transformers import PatchTSTConfig, PatchTSTForPrediction

    spec = importlib.util.spec_from_file_location("cp_compress", ROOT / "recipes" / "cp_compress.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    csv = tmp_path / "energy.csv"
    pd.read_csv(appliances_energy_csv()).iloc[:1500][["date", "Appliances", "T2"]].to_csv(csv, index=False)
    config = PatchTSTConfig(
        num_input_channels=2,
        context_length=40,
        prediction_length=10,
        patch_length=8,
        patch_stride=8,
        d_model=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
    )
    PatchTSTForPrediction(config).save_pretrained(tmp_path / "pretrained")
    results = recipe.main(
        [
            "--model",
            str(tmp_path / "pretrained"),
            "--dataset",
            str(csv),
            "--target",
            "Appliances",
            "--covariates",
            "T2",
            "--method",
            "svd",
            "--rank",
            "0.25",
            "--max-steps",
            "0",
            "--finetune-steps",
            "1",
            "--batch-size",
            "4",
            "--eval-stride",
            "25",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    assert results["horizon"] == 10 and results["context_length"] == 40
    dense, _, untuned, tuned = results["runs"]
    assert dense["train_seconds"] == 0.0 and tuned["train_seconds"] > 0
    assert untuned["params"] == tuned["params"] < dense["params"]
    assert tuned["attention_params"] <= 0.3 * dense["attention_params"]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["compression_config"]["method"] == "svd"
    printed = capsys.readouterr().out  # what was read, and that the covariate cannot change a PatchTST forecast
    assert "targets (scored): Appliances; covariates (inputs only): T2" in printed
    assert "note: patchtst is channel-independent" in printed and "1 covariate(s) do not influence" in printed
