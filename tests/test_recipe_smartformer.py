"""Smoke run of the main job, recipes/smartformer.py, on a user's CSV: results, trace, plot and a loadable model."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import run_without_library

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smartformer.py"


@pytest.mark.slow  # the whole recipe (dense, Smartformer, SVD-Smartformer, fixed CP grid): the slow tier
def test_recipe_runs_on_a_csv_and_writes_results_trace_and_model(tmp_path):
    steps = np.arange(600)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "when": pd.date_range("2024-01-01", periods=len(steps), freq="h"),
            "load": np.sin(steps / 10) + 0.1 * rng.standard_normal(len(steps)),
            "temperature": np.cos(steps / 7),
        }
    )
    frame.to_csv(tmp_path / "series.csv", index=False)
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(RECIPE),
        "--model",
        "patchtst",
        "--dataset",
        str(tmp_path / "series.csv"),
        "--horizon",
        "8",
        "--context",
        "32",
        "--steps",
        "24",
        "--seeds",
        "3",
        "--runs",
        "dense",
        "smartformer",
        "uniform-cp-scheduled",
        "--output-dir",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    assert results["model"] == "patchtst" and results["horizon"] == 8
    assert [run["name"] for run in results["runs"]] == ["dense", "smartformer", "uniform-cp-scheduled"]
    for run in results["runs"]:
        assert {"name", "seed", "metrics", "params", "attention_params", "flops", "ranks", "train_seconds"} <= set(run)
        assert np.isfinite(run["metrics"]["mse"]) and np.isfinite(run["metrics"]["mae"])
    dense, smart, scheduled = results["runs"]
    trace = json.loads((out / "smartformer_trace.json").read_text())
    # the baseline on the search's schedule: cut where the search ended, to one rank at the search's count
    assert scheduled["switch_step"] == next((r["step"] for r in trace if r["done"]), trace[-1]["step"])
    assert len(set(scheduled["ranks"].values())) == 1 and scheduled["selected_step"] >= scheduled["switch_step"]
    assert smart["seed"] == 3 and smart["agent_seed"] == 3  # the training seed seeds the search's agent too
    assert smart["attention_params"] <= dense["attention_params"]
    # model selection: the dense run is checked on validation at its last step (24 < every 25 steps)
    assert dense["selected_step"] == 24 and np.isfinite(dense["validation_mse"])
    assert (out / "results.md").read_text().count("|") > 10
    assert (out / "smartformer_trace.png").stat().st_size > 0
    assert json.loads((out / "smartformer_trace.json").read_text())  # at least one decision traced

    loaded = run_without_library(
        f"""
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(out / "smartformer-model")!r}, trust_remote_code=True)
        print(sum(p.numel() for p in model.parameters()))
        """,
        cwd=tmp_path,
    )
    assert int(loaded.stdout.split()[-1]) == smart["params"]
