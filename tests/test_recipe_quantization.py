"""The Smartformer recipe's quantization and low-bit arms on a small CSV: PTQ of the dense run, ternary QAT, SVD on
every Linear with factors stored low-bit (post-training, saved and reloaded; or trained at 4 bits)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import PatchTSTConfig, PatchTSTForPrediction

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smartformer.py"


@pytest.fixture(scope="module")
def smartformer():
    spec = importlib.util.spec_from_file_location("smartformer_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def series_csv(path: Path) -> Path:
    steps = np.arange(1200)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "when": pd.date_range("2024-01-01", periods=len(steps), freq="h"),
            "load": np.sin(steps / 10) + 0.1 * rng.standard_normal(len(steps)),
        }
    )
    frame.to_csv(path, index=False)
    return path


def test_quantization_arms_count_bytes_and_reload(smartformer, tmp_path):
    runs = [
        "dense",
        "ptq-int8-all",
        "ptq-int2-qkv",
        "qat-ternary-all",
        "svd-all-0.5-scheduled",
        "svd-all-0.5-scheduled+int4",
        "svd-all-0.5-q4",
    ]
    results = smartformer.main(
        [
            "--model",
            "patchtst",
            "--dataset",
            str(series_csv(tmp_path / "series.csv")),
            "--horizon",
            "8",
            "--context",
            "64",
            "--steps",
            "6",
            "--all-linear-ratios",
            "0.5",
            "--switch-step",
            "3",
            "--runs",
            *runs,
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    by_name = {run["name"]: run for run in results["runs"]}
    assert set(by_name) == set(runs)
    disk = {name: run["linear_bytes"]["disk_ratio"] for name, run in by_name.items()}
    assert disk["dense"] == 1.0 and 0.25 < disk["ptq-int8-all"] < 0.35 and disk["qat-ternary-all"] < 0.1
    assert by_name["ptq-int2-qkv"]["attention_bytes"]["disk_ratio"] < 0.2 and disk["ptq-int2-qkv"] > 0.5
    assert disk["svd-all-0.5-scheduled+int4"] < disk["svd-all-0.5-scheduled"] / 2  # narrow layers stay fp32
    assert disk["svd-all-0.5-q4"] == pytest.approx(disk["svd-all-0.5-scheduled+int4"])
    reloaded = by_name["svd-all-0.5-scheduled+int4"]  # scored after save_pretrained + from_pretrained: packed in RAM
    assert reloaded["linear_bytes"]["ram"] == reloaded["linear_bytes"]["disk"]
    assert by_name["svd-all-0.5-scheduled"]["switch_step"] == 3
    assert all(np.isfinite(run["metrics"]["mse"]) for run in results["runs"])
    out = tmp_path / "out"
    assert (out / "bytes_pareto.png").exists() and json.loads((out / "bytes_pareto.json").read_text())["budgets"]
    assert "within each byte budget" in (out / "results.md").read_text()


def test_post_training_arms_need_their_source(smartformer, tmp_path, capsys):
    with pytest.raises(SystemExit):
        smartformer.main(
            [
                "--model",
                "patchtst",
                "--dataset",
                str(series_csv(tmp_path / "s.csv")),
                "--horizon",
                "8",
                "--context",
                "64",
                "--runs",
                "ptq-int4-all",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
    assert "add them" in capsys.readouterr().err


@pytest.mark.slow
def test_byte_budget_arms_run_and_save_the_searched_model(smartformer, tmp_path):
    """``--budget-ratio`` adds the byte search over forms, its equal-bytes baselines, its forms trained from the
    start and int-N QAT, and
    ``lowbit-<bits>-g<group>`` the lowbit method; the searched model is saved with every Linear's form, loads back
    scoring what it scored trained, and the naive forecasts sit beside the arms."""
    runs = ["dense", "smartformer-bytes", "uniform-svd-bytes", "random-bytes", "greedy-bytes", "searched-bytes"]
    runs += ["qat-int4-all"]
    runs += ["lowbit-2-g16"]
    results = smartformer.main(
        ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--context", "64", "--horizon", "16",
         "--steps", "30", "--budget-ratio", "1/8", "--random-draws", "1", "--factor-widths", "4", "2",
         "--max-candidates", "3", "--runs", *runs,
         "--output-dir", str(tmp_path / "out")]
    )  # fmt: skip
    assert [run["name"] for run in results["runs"]] == runs
    searched = results["runs"][1]
    assert set(searched["factor_bits"].values()) <= {None, 4, 2}
    assert searched["loaded_metrics"]["mse"] == pytest.approx(searched["metrics"]["mse"], rel=1e-5)
    loaded = searched["loaded_bytes"]  # packed as it trained: what every Linear stores is what it holds loaded
    assert loaded["linear"]["disk"] == loaded["linear"]["ram"] == searched["linear_bytes"]["disk"]
    weights = (tmp_path / "out" / "smartformer-bytes-model" / "model.safetensors").stat().st_size
    assert loaded["weight_files"] == weights > loaded["model"]["disk"] > loaded["linear"]["disk"]
    retrained = results["runs"][runs.index("searched-bytes")]  # the search's forms, trained from the first step
    assert retrained["factor_bits"] == searched["factor_bits"]
    assert retrained["linear_bytes"] == searched["linear_bytes"]
    assert retrained["metrics"]["mse"] != searched["metrics"]["mse"]
    assert results["runs"][-1]["linear_bytes"]["disk_ratio"] < 0.2  # lowbit-2-g16: 4 bits a weight, and the biases
    assert set(results["naive"]) == {"training-mean", "last-value", "last-season-24"}  # a day; a week > 64 steps
    assert results["seasons"] == [24]
    saved = json.loads((tmp_path / "out" / "smartformer-bytes-model" / "config.json").read_text())
    assert saved["compression_config"]["method"] == "mixed"
    modules = saved["compression_config"]["modules"]
    assert {name: spec.get("factor_bits", spec.get("bits")) for name, spec in modules.items()} == searched[
        "factor_bits"
    ]
    assert "Naive forecasts" in (tmp_path / "out" / "results.md").read_text()


def test_distill_teaches_every_arm_with_the_dense_run(smartformer, tmp_path, capsys):
    """``--distill`` trains every arm after dense against the dense forecast, records its weight, and needs dense."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8",
              "--context", "64", "--steps", "6", "--distill", "1/2"]  # fmt: skip
    with pytest.raises(SystemExit):
        smartformer.main([*common, "--runs", "qat-ternary-all", "--output-dir", str(tmp_path / "none")])
    assert "add dense to --runs" in capsys.readouterr().err
    results = smartformer.main([*common, "--runs", "dense", "qat-ternary-all", "--output-dir", str(tmp_path / "out")])
    weights = {run["name"]: run["distill_weight"] for run in results["runs"]}
    assert weights == {"dense": None, "qat-ternary-all": 0.5}
    assert all(np.isfinite(run["metrics"]["mse"]) for run in results["runs"])


def test_weight_average_keeps_every_arms_averaged_weights(smartformer, tmp_path, capsys):
    """``--weight-average DECAY`` scores every arm's moving average (recorded), a different model than the live
    weights give; a decay outside (0, 1) is refused before anything trains."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8",
              "--context", "64", "--steps", "6", "--runs", "dense", "lowbit-ternary-g16"]  # fmt: skip
    with pytest.raises(SystemExit):
        smartformer.main([*common, "--weight-average", "1", "--output-dir", str(tmp_path / "none")])
    assert "a decay in (0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    live = smartformer.main([*common, "--output-dir", str(tmp_path / "live")])
    averaged = smartformer.main([*common, "--weight-average", "0.5", "--output-dir", str(tmp_path / "averaged")])
    assert [run["weight_average"] for run in averaged["runs"]] == [0.5, 0.5]
    assert json.loads((tmp_path / "averaged" / "results.json").read_text())["weight_average"] == 0.5
    for plain, average in zip(live["runs"], averaged["runs"]):
        assert plain["weight_average"] is None
        assert np.isfinite(average["metrics"]["mse"]) and average["metrics"]["mse"] != plain["metrics"]["mse"]


def test_an_after_dense_arm_trains_dense_first_and_stores_the_quantized_form(smartformer, tmp_path, capsys):
    """``lowbit-…-after-dense-<f>`` trains dense for that share of the steps, then the form for the rest (model
    selection only there), and stores what the arm trained from the first step stores; no phase may be empty."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8",
              "--context", "64", "--steps", "6"]  # fmt: skip
    with pytest.raises(SystemExit):
        smartformer.main([*common, "--runs", "lowbit-2-g16-after-dense-0.95", "--output-dir", str(tmp_path / "none")])
    assert "6 dense steps leave no step of one phase" in capsys.readouterr().err
    runs = ["lowbit-2-g16", "lowbit-2-g16-after-dense-0.5"]
    results = smartformer.main([*common, "--runs", *runs, "--output-dir", str(tmp_path / "out")])
    plain, after = results["runs"]
    assert (plain["dense_steps"], after["dense_steps"]) == (None, 3)
    assert plain["steps"] == after["steps"] == 6 and 3 < after["selected_step"] <= 6
    assert after["linear_bytes"] == plain["linear_bytes"]
    assert after["metrics"]["mse"] != plain["metrics"]["mse"]  # another start: the dense phase's weights
    assert (tmp_path / "out" / "runs" / "lowbit-2-g16-after-dense-0.5-seed0-dense-phase").is_dir()


def test_a_byte_budget_below_every_cheapest_form_stops_before_any_arm_trains(smartformer, tmp_path, capsys):
    with pytest.raises(SystemExit):
        smartformer.main(
            ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8", "--context",
             "64", "--budget-ratio", "1/1000", "--runs", "dense", "smartformer-bytes", "--output-dir",
             str(tmp_path / "out")]
        )  # fmt: skip
    error = capsys.readouterr().err
    assert "--budget-ratio with these --forms" in error and "the cheapest form of every Linear takes" in error
    assert not (tmp_path / "out" / "runs").exists()  # dense never trained


def test_a_resumed_low_bit_arm_scores_as_the_uninterrupted_run(smartformer, tmp_path):
    """``--resume`` from a checkpoint a quantization-aware arm wrote mid-run (as after a crash) ends with the test
    MSE and the selected step of the run that never stopped: the checkpoint holds the fp32 weights behind the codes,
    the best validation weights so far and the moving average."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8",
              "--context", "64", "--steps", "8", "--save-steps", "4", "--runs", "lowbit-ternary-g16",
              "--weight-average", "0.5"]  # fmt: skip
    (whole,) = smartformer.main([*common, "--output-dir", str(tmp_path / "whole")])["runs"]
    run = Path("runs") / "lowbit-ternary-g16-seed0"
    shutil.copytree(tmp_path / "whole" / run / "checkpoint-4", tmp_path / "resumed" / run / "checkpoint-4")
    (again,) = smartformer.main([*common, "--output-dir", str(tmp_path / "resumed"), "--resume"])["runs"]
    assert again["resumed_from"] == "checkpoint-4"
    assert (again["metrics"], again["selected_step"]) == (whole["metrics"], whole["selected_step"])


def test_a_narrow_arm_trains_a_smaller_model_and_counts_its_bytes_against_the_full_width(smartformer, tmp_path, capsys):
    """``narrow-<d_model>[x<layers>][-ffn<width>][-shared][-<arm>]`` trains a fresh model at that width (heads and FFN
    in proportion), depth and FFN width, dense or as the named arm (low-bit, the wider ends rotated), its later
    layers reusing the first's Linears where shared, and its fractions are of the full-width model's fp32 bytes; a
    shape the model cannot take, or a checkpoint to start from, is refused before anything trains."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--horizon", "8",
              "--context", "64", "--steps", "4"]  # fmt: skip
    for runs, message in ((["narrow-12"], "a multiple of the head width 8 up to the full width 32 (e.g. 8, 16, 24)"),
                          (["narrow-40x1"], "a multiple of the head width 8 up to the full width 32"),
                          (["narrow-32"], "no smaller than the model; narrow it below d_model 32, give it fewer"),
                          (["narrow-32x2"], "narrow-32x2: the full width with 2 encoder layers and an FFN of 64 is"),
                          (["narrow-32-ffn64"], "or an FFN narrower than its 64 (narrow-32-ffn32)"),
                          (["narrow-32x0"], "unknown ['narrow-32x0']"),
                          (["narrow-32x1-shared-ends-8-4"], "one encoder layer has no later layer to share"),
                          (["narrow-16-shared-lowbit-4-g16"], "-shared is dense or takes an ends- arm after it")):  # fmt: skip
        with pytest.raises(SystemExit):
            smartformer.main([*common, "--runs", *runs, "--output-dir", str(tmp_path / "none")])
        assert message in capsys.readouterr().err
    checkpoint = tmp_path / "dense-checkpoint"
    PatchTSTForPrediction(PatchTSTConfig(num_input_channels=1, context_length=64, prediction_length=8)).save_pretrained(
        checkpoint
    )
    with pytest.raises(SystemExit):
        smartformer.main([*common, "--runs", "narrow-16", "--model-path", str(checkpoint), "--output-dir", "x"])
    assert "trains a fresh narrower model" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    runs = ["dense", "narrow-16", "narrow-16-lowbit-4-g16", "narrow-16-ends-8-4-hadamard", "narrow-32x1-ends-8-4",
            "narrow-32-ffn16", "narrow-32-shared-ends-8-4"]  # fmt: skip
    results = smartformer.main([*common, "--runs", *runs, "--output-dir", str(tmp_path / "out")])
    dense, narrow, narrow_lowbit, narrow_ends, shallow, thin, shared = results["runs"]
    assert [run["d_model"] for run in results["runs"]] == [32, 16, 16, 16, 32, 32, 32]
    assert [run["encoder_layers"] for run in results["runs"]] == [2, 2, 2, 2, 1, 2, 2]
    assert [run["ffn_dim"] for run in results["runs"]] == [64, 32, 32, 32, 64, 16, 64]
    # two layers, the second computing with the first's Linears: the bytes of one layer, another model
    assert shared["linear_bytes"]["disk"] == shallow["linear_bytes"]["disk"]
    assert shared["shared_from"] == {
        f"model.encoder.layers.1.{linear}": f"model.encoder.layers.0.{linear}"
        for linear in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "ff.0", "ff.3")
    }
    assert shared["metrics"]["mse"] != shallow["metrics"]["mse"]
    assert thin["linear_bytes"]["disk"] < dense["linear_bytes"]["disk"] == thin["linear_bytes"]["full_width_dense"]
    assert shallow["linear_bytes"]["full_width_dense"] == dense["linear_bytes"]["dense"]
    assert dense["linear_bytes"]["dense"] / 2 < shallow["linear_bytes"]["dense"] < dense["linear_bytes"]["dense"]
    assert set(narrow_ends["factor_bits"].values()) == {8, 4, "ternary"}
    assert narrow_ends["linear_bytes"]["full_width_dense"] == dense["linear_bytes"]["dense"]
    full = dense["linear_bytes"]["dense"]
    assert narrow["linear_bytes"]["full_width_dense"] == narrow_lowbit["linear_bytes"]["full_width_dense"] == full
    assert narrow["linear_bytes"]["disk"] == narrow["linear_bytes"]["dense"] < full / 2
    assert narrow["linear_bytes"]["disk_ratio"] == narrow["linear_bytes"]["disk"] / full
    assert narrow_lowbit["linear_bytes"]["disk"] < narrow["linear_bytes"]["disk"] / 4
    assert narrow_lowbit["linear_bytes"]["disk_ratio"] == narrow_lowbit["linear_bytes"]["disk"] / full
    assert set(narrow_lowbit["factor_bits"].values()) == {4}
    assert narrow["metrics"]["mse"] != dense["metrics"]["mse"]


def test_the_byte_search_on_a_shared_shape_searches_one_layers_linears_for_every_use(smartformer, tmp_path, capsys):
    """``--search-shape narrow-<d>x<layers>-shared``: the search and its allocations train that shape, its later
    layers computing with the first's Linears (``SearchConfig.shared``), within ``--budget-ratio`` of the full model's
    fp32 Linears; greedy measures on the shape's dense arm; the searched model reloads scoring as it trained."""
    common = ["--model", "patchtst", "--dataset", str(series_csv(tmp_path / "s.csv")), "--context", "64", "--horizon",
              "16", "--steps", "30", "--random-draws", "1", "--factor-widths", "4", "2", "--max-candidates", "3",
              "--search-schedule", "2", "1", "2"]  # fmt: skip
    for flags, message in ((["--search-shape", "narrow-32x3-shared-ends-8-4", "--budget-ratio", "1/8"], "without an arm"),
                           (["--search-shape", "narrow-32x3-shared"], "pass --budget-ratio too"),
                           (["--search-shape", "narrow-32x3-shared", "--budget-ratio", "1/8", "--runs", "dense",
                             "smartformer-bytes", "greedy-bytes"], "on the narrow-32x3-shared run; add it")):  # fmt: skip
        with pytest.raises(SystemExit):
            smartformer.main([*common, *flags, "--output-dir", str(tmp_path / "none")])
        assert message in capsys.readouterr().err
    runs = ["dense", "narrow-32x3-shared", "smartformer-bytes", "greedy-bytes", "searched-bytes"]
    flags = ["--search-shape", "narrow-32x3-shared", "--budget-ratio", "1/8", "--runs", *runs]
    results = smartformer.main([*common, *flags, "--output-dir", str(tmp_path / "out")])
    assert [run["name"] for run in results["runs"]] == runs
    dense, shape, searched, greedy, retrained = results["runs"]
    assert [run["encoder_layers"] for run in results["runs"]] == [2, 3, 3, 3, 3]
    later = {name: source for name, source in shape["shared_from"].items()}
    assert len(later) == 12 and all(".layers.0." in source for source in later.values())
    for run in (searched, greedy, retrained):  # every use of one layer's Linears, within 1/8 of the full model's
        assert run["shared_from"] == later
        assert run["linear_bytes"]["full_width_dense"] == dense["linear_bytes"]["dense"]
        assert run["linear_bytes"]["disk_ratio"] <= 1 / 8
    assert not set(searched["forms"]) & set(later)
    assert greedy["linear_bytes"]["disk"] <= searched["linear_bytes"]["disk"]
    assert retrained["linear_bytes"] == searched["linear_bytes"]
    assert searched["loaded_metrics"]["mse"] == pytest.approx(searched["metrics"]["mse"], rel=1e-5)
    saved = json.loads((tmp_path / "out" / "smartformer-bytes-model" / "config.json").read_text())
    assert {name for name, form in saved["compression_config"]["forms"].items() if form["method"] == "shared"} == set(
        later
    )
