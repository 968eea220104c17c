"""A user's CSV is read the way the printout says: nothing dropped, encoded or turned into a target silently, errors
name only flags the user passed, and tables say what their ± is."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction

from hf_tensorcompress.data import describe_forecasting, prepare_forecasting
from hf_tensorcompress.evaluation.tables import runs_table

from recipekit.forecasters import covariate_note

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smartformer.py"


@pytest.fixture(scope="module")
def smartformer():
    spec = importlib.util.spec_from_file_location("smartformer_recipe_csv", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def wide(rows: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "date": pd.date_range("2024-01-01", periods=rows, freq="h"),
            "load": rng.standard_normal(rows),
            "temp": rng.standard_normal(rows),
            "wind": rng.standard_normal(rows),
            "kind": rng.choice(["a", "b"], rows),
        }
    )


def test_target_alone_prints_the_columns_it_leaves_out():
    data = prepare_forecasting(wide(), columns=["load"], covariates=["temp"], drop_columns=["kind"])
    text = describe_forecasting(data, "frame")
    assert "not used" in text and "wind" in text.split("not used")[1]
    assert "temp" not in text.split("not used")[1]  # a covariate is used


def test_one_hot_of_a_column_not_used_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"one_hot=\['kind'\].*--one-hot kind"):
        prepare_forecasting(wide(), columns=["load"], one_hot=["kind"])
    data = prepare_forecasting(wide(), columns=["load"], covariates=["kind"], one_hot=["kind"])
    assert "kind=a" in describe_forecasting(data, "frame")


def test_boolean_column_is_not_turned_into_scored_channels_per_series():
    rows = 40
    frame = pd.DataFrame(
        {
            "date": list(pd.date_range("2024-01-01", periods=rows, freq="h")) * 2,
            "id": ["a"] * rows + ["b"] * rows,
            "y": np.arange(2 * rows, dtype=float),
            "holiday": [True, False] * rows,
        }
    )
    with pytest.raises(ValueError, match=r"\['holiday'\] hold True/False.*--covariates holiday"):
        prepare_forecasting(frame, id_column="id")
    data = prepare_forecasting(frame, id_column="id", columns=["y"], covariates=["holiday"])
    assert "targets (scored): a/y, b/y;" in describe_forecasting(data, "frame")


def test_patchtst_ignores_covariates_and_the_recipe_says_so():
    """The printed claim is true: changing a covariate leaves PatchTST's forecast of the target unchanged."""
    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=3, context_length=32, prediction_length=8, patch_length=8, patch_stride=8, d_model=16
    )
    model = PatchTSTForPrediction(config).eval()
    past = torch.randn(2, 32, 3)
    noisy = past.clone()
    noisy[..., 1:] = torch.randn(2, 32, 2) * 10
    with torch.no_grad():
        first = model(past_values=past).prediction_outputs[..., 0]
        second = model(past_values=noisy).prediction_outputs[..., 0]
    assert torch.allclose(first, second, atol=1e-5)
    note = covariate_note("patchtst", ["temp", "wind"])
    assert "do not influence the targets' forecast" in note and "2 covariate(s)" in note
    assert covariate_note("autoformer", ["temp"]) is None and covariate_note("patchtst", []) is None


def test_steps_one_names_only_flags_the_user_passed(smartformer, tmp_path):
    from recipekit.forecasters import SIZES, Size, build_model
    from recipekit.smartformer_arms import build_plan

    size = Size(**{**SIZES["demo"].__dict__, "steps": 1})
    model = build_model("patchtst", 1, 32, 8, size, 0)
    args = smartformer.parse_args(["--model", "patchtst", "--steps", "1"])
    with pytest.raises(ValueError) as error:
        build_plan(size, args, model)
    assert "--steps 1" in str(error.value) and "--switch-step" not in str(error.value)
    args = smartformer.parse_args(["--model", "patchtst", "--steps", "1", "--runs", "dense", "ptq-int8-all"])
    assert [arm[0] for arm in build_plan(size, args, model).arms] == ["dense", "ptq-int8-all"]
    args = smartformer.parse_args(["--model", "patchtst", "--steps", "4", "--switch-step", "9"])
    with pytest.raises(ValueError, match="--switch-step 9"):
        build_plan(Size(**{**size.__dict__, "steps": 4}), args, model)


def test_help_lists_the_run_names(smartformer, capsys):
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--help"])
    text = capsys.readouterr().out
    for name in ("smartformer", "uniform-cp", "ptq-int4-all", "qat-ternary-all", "svd-all-<ratio>"):
        assert name in text


def test_tables_label_their_spread_as_sample_std():
    runs = [{"name": "dense", "metrics": {"mse": value}} for value in (1.0, 2.0, 3.0)]
    table = runs_table(runs, {"mse": "MSE"}, {})
    assert "2.0000 ± 1.0000" in table  # ddof=1: std of 1, 2, 3 is 1 (the population std would be 0.8165)
    assert "mean ± std over 3 seeds (sample standard deviation, ddof=1)" in table
    assert "±" not in runs_table(runs[:1], {"mse": "MSE"}, {})


def test_a_wide_files_true_false_column_is_not_made_a_scored_target():
    frame = wide().drop(columns=["kind"]).assign(holiday=[True, False, False] * 20)
    with pytest.raises(
        ValueError, match=r"\['holiday'\] hold True/False.*--covariates holiday.*--drop-columns holiday"
    ):
        prepare_forecasting(frame)
    data = prepare_forecasting(frame, columns=["load"], covariates=["holiday"])
    assert "targets (scored): load; covariates (inputs only): holiday" in describe_forecasting(data, "frame")


def test_one_hot_columns_are_not_made_scored_targets_by_default():
    with pytest.raises(ValueError, match=r"one_hot=\['kind'\].*\['kind=a', 'kind=b'\].*--covariates kind"):
        prepare_forecasting(wide(), one_hot=["kind"])
    data = prepare_forecasting(wide(), one_hot=["kind"], covariates=["kind"])
    text = describe_forecasting(data, "frame")
    assert "targets (scored): load, temp, wind; covariates (inputs only): kind=a, kind=b" in text


def test_a_hint_naming_a_column_can_be_pasted_into_a_shell():
    """``--drop-columns Unnamed: 0`` (a pandas index written to the CSV) split into two values when pasted."""
    import argparse
    import re
    import shlex

    from hf_tensorcompress.data.arguments import add_forecasting_arguments, forecasting_options

    frame = wide().drop(columns=["kind"]).reset_index().rename(columns={"index": "Unnamed: 0"})
    with pytest.raises(ValueError) as error:
        prepare_forecasting(frame)
    hint = re.search(r"\((--drop-columns [^)]*)\)", str(error.value)).group(1)
    assert hint == "--drop-columns 'Unnamed: 0'"
    parser = argparse.ArgumentParser()
    add_forecasting_arguments(parser)
    options = forecasting_options(parser.parse_args(shlex.split(hint)))
    assert "Unnamed: 0" not in describe_forecasting(prepare_forecasting(frame, **options), "frame")


def test_evaluate_reads_a_csv_with_the_flags_its_errors_name(tmp_path, capsys):
    """``evaluate --dataset my.csv`` refused a text column and suggested --one-hot / --drop-columns, which it did not
    take; it takes the recipes' data flags now and prints what it read (the JSON stays alone on stdout)."""
    from hf_tensorcompress.cli import main

    wide(200).to_csv(tmp_path / "mine.csv", index=False)
    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=3, context_length=32, prediction_length=8, patch_length=8, patch_stride=8, d_model=16
    )
    PatchTSTForPrediction(config).save_pretrained(tmp_path / "model")
    argv = ["evaluate", str(tmp_path / "model"), "--dataset", str(tmp_path / "mine.csv"), "--stride", "8"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "--one-hot kind" in error and "--drop-columns kind" in error
    assert main([*argv, "--drop-columns", "kind", "--target", "load", "--covariates", "temp", "wind"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["runs"][0]["metrics"]["mse"] > 0
    assert "targets (scored): load; covariates (inputs only): temp, wind" in err
    assert "note: patchtst is channel-independent" in err
