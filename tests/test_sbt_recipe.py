"""The SBT scoring helpers (library) and tiny end-to-end runs of the recipe: JapaneseVowels and a user's own CSV."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hf_tensorcompress.evaluation.anomaly import detection_scores, point_adjust, pot_threshold
from hf_tensorcompress.evaluation.sequences import step_t_prediction

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "sbt.py"


@pytest.fixture(scope="module")
def sbt():
    spec = importlib.util.spec_from_file_location("sbt_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_point_adjust_marks_whole_detected_segments():
    labels = np.array([0, 1, 1, 1, 0, 0, 1, 1, 0])
    predicted = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0], bool)
    assert point_adjust(predicted, labels).astype(int).tolist() == [0, 1, 1, 1, 0, 1, 0, 0, 0]
    scores = detection_scores(predicted, labels)
    assert scores["precision"] == pytest.approx(3 / 4) and scores["recall"] == pytest.approx(3 / 5)


def test_pot_threshold_matches_the_exponential_tail():
    rng = np.random.default_rng(0)
    scores = rng.exponential(1.0, 200_000)
    threshold = pot_threshold(scores, risk=1e-3, initial_quantile=0.98)
    assert threshold == pytest.approx(-np.log(1e-3), rel=0.05)  # exact quantile of Exp(1) at risk 1e-3


def test_tiny_classification_run_writes_results(sbt, tmp_path):
    results = sbt.main(
        [
            "--task",
            "classification",
            "--output_dir",
            str(tmp_path),
            "--keep_ratios",
            "0.5",
            "--seeds",
            "0",
            "--max_steps",
            "2",
            "--d_model",
            "16",
            "--ffn_dim",
            "16",
        ]
    )
    saved = json.loads((tmp_path / "results.json").read_text())
    ptq = [f"ptq-{scheme}-{scope}" for scope in ("qkv", "all") for scheme in ("int8", "int4", "int2")]
    assert saved["task"] == "classification" and [r["name"] for r in saved["runs"]] == [
        "dense",
        "biprop-0.5",
        "qat-ternary-qkv",
        "qat-ternary-all",
        *ptq,
    ]
    assert all(run["steps"] == 2 for run in saved["runs"])  # the same budget for every arm
    dense, biprop = saved["runs"][:2]
    by_name = {run["name"]: run for run in saved["runs"]}
    disk = {name: run["linear_bytes"]["disk"] for name, run in by_name.items()}
    assert disk["dense"] > disk["ptq-int8-all"] > disk["ptq-int4-all"] > disk["ptq-int2-all"] > disk["qat-ternary-all"]
    assert disk["dense"] > disk["ptq-int8-qkv"] and by_name["ptq-int8-all"]["selected_step"] == dense["selected_step"]
    assert (tmp_path / "bytes_pareto.png").exists() and "within each byte budget" in (
        tmp_path / "results.md"
    ).read_text()
    for run in saved["runs"][:2]:
        assert set(run) >= {
            "name",
            "keep_ratio",
            "seed",
            "metrics",
            "params",
            "storage_bits",
            "nonzero_flops",
            "checkpoint_bytes",
            "train_seconds",
            "steps",
            "selected_step",
        }
        assert 0.0 <= run["metrics"]["accuracy"] <= 1.0
    assert biprop["storage_bits"] < dense["storage_bits"] and biprop["nonzero_flops"] < dense["nonzero_flops"]
    assert biprop["checkpoint_bytes"] < dense["checkpoint_bytes"]
    assert "| biprop-0.5 |" in (tmp_path / "results.md").read_text()
    assert "Every arm: 2 optimizer steps" in (tmp_path / "results.md").read_text()
    assert results["runs"][1]["metrics"] == biprop["metrics"]


def test_quantization_arms_can_be_left_out(sbt, tmp_path):
    sbt.main(
        [
            "--task",
            "classification",
            "--output_dir",
            str(tmp_path),
            "--keep_ratios",
            "--seeds",
            "0",
            "--max_steps",
            "1",
            "--d_model",
            "8",
            "--ffn_dim",
            "8",
            "--ptq-schemes",
            "int4",
            "--qat-scopes",
        ]
    )
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in saved["runs"]] == ["dense", "ptq-int4-qkv", "ptq-int4-all"]


def test_step_t_prediction_scales_by_history_and_zeroes_step_t():
    from types import SimpleNamespace

    import torch

    class Echo(torch.nn.Module):  # returns its input as the per-step reconstruction
        def forward(self, past_values):
            self.seen = past_values
            return SimpleNamespace(prediction_output=past_values.transpose(1, 2).unsqueeze(-1))

    values = torch.randn(4, 10, 3) * 5 + 7
    model = Echo()
    assert torch.allclose(step_t_prediction(model, values, zero_current=False), values[:, -1], atol=1e-4)
    predicted = step_t_prediction(model, values, zero_current=True)
    assert torch.all(model.seen[:, -1] == 0)  # x_t never reaches the model
    assert torch.allclose(predicted, values[:, :-1].mean(dim=1), atol=1e-4)  # zero in scaled space = history mean
