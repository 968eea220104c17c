"""Recipes end a user mistake with one ``<recipe>: error: ...`` line and exit code 2 (no traceback), naming the flag."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_recipe", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the recipe look their module up
    spec.loader.exec_module(module)
    return module


def error_line(capsys, module, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        module.main(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name", ["smartformer", "cp_compress"])
def test_forecasting_recipes_report_user_errors_in_one_line(name, tmp_path, capsys):
    module = recipe(name)
    out = ["--output-dir", str(tmp_path / "out")]
    assert "my_series.csv does not exist" in error_line(capsys, module, ["--dataset", "my_series.csv", *out])
    stamps = pd.date_range("2024-01-01", periods=300, freq="h")
    air = pd.DataFrame(
        {
            "No": np.arange(1, 301),
            "year": stamps.year,
            "month": stamps.month,
            "day": stamps.day,
            "hour": stamps.hour,
            "pm": np.arange(300.0) % 7,
            "wind": ["NW", "SE", "cv"] * 100,
        }
    )
    path = str(tmp_path / "air.csv")
    air.to_csv(path, index=False)
    line = error_line(capsys, module, ["--dataset", path, *out])
    assert "['wind'] are not numeric" in line and "--one-hot wind" in line
    line = error_line(capsys, module, ["--dataset", path, "--one-hot", "wind", "--drop-columns", "No", *out])
    assert "--timestamp-columns year month day hour" in line
    long = pd.concat([pd.DataFrame({"ds": stamps, "unique_id": uid, "y": np.arange(300.0)}) for uid in ("a", "b")])
    long.to_csv(tmp_path / "long.csv", index=False)
    assert "--id-column" in error_line(capsys, module, ["--dataset", str(tmp_path / "long.csv"), *out])


def test_sbt_reports_user_errors_in_one_line(tmp_path, capsys):
    module = recipe("sbt")
    out = ["--task", "classification", "--output-dir", str(tmp_path / "out")]
    assert "vowels.csv does not exist" in error_line(capsys, module, ["--dataset", "vowels.csv", *out])
    frame = pd.DataFrame({"series": np.repeat(np.arange(8), 4), "v": np.arange(32.0), "label": np.repeat([0, 1], 16)})
    frame.to_csv(tmp_path / "long.csv", index=False)
    line = error_line(capsys, module, ["--dataset", str(tmp_path / "long.csv"), "--label-column", "class", *out])
    assert "--label-column" in line and "'class'" in line
    assert "--steps" in error_line(capsys, module, ["--steps", "0", *out])


def test_smartformer_baselines_at_the_search_count_need_the_search(tmp_path, capsys):
    module = recipe("smartformer")
    out = ["--output-dir", str(tmp_path / "out"), "--model", "patchtst"]
    line = error_line(capsys, module, ["--runs", "dense", "random-ranks", *out])
    assert "['random-ranks']" in line and "add smartformer" in line
    assert "unknown ['uniform']" in error_line(capsys, module, ["--runs", "uniform", *out])
    assert "--random-draws 0 must be >= 1" in error_line(capsys, module, ["--random-draws", "0", *out])
