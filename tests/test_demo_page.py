"""``make demo`` and its documentation agree: the page's one-seed table is what the recipe's ``results.md`` writer
makes of the committed ``results.json`` of a ``make demo`` run, and the recipe announces each run with an estimate."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "smartformer.md"
RESULTS = ROOT / "docs" / "results" / "smartformer_demo.json"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("smartformer_demo_recipe", ROOT / "recipes" / "smartformer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def demo_runs() -> list[str]:
    """The run names ``make demo`` passes to the recipe (the Makefile's ``--runs``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    return re.search(r"--runs ([^\n]+)", demo).group(1).split()


def test_the_page_shows_the_table_make_demo_writes(recipe):
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert [run["name"] for run in results["runs"]] == demo_runs()
    assert {run["seed"] for run in results["runs"]} == {0}  # the recipe's default --seeds
    assert results["steps"] == recipe.SIZES["demo"].steps and results["model"] == "autoformer"
    # no equal-byte baseline among them, so results.md is this table alone (no Pareto section)
    assert all(recipe.kind_of(run["name"]) != "baseline" for run in results["runs"])
    assert recipe.markdown(results) in PAGE.read_text(encoding="utf-8")


def test_each_run_is_announced_with_its_index_and_an_estimate():
    from recipekit.run_headers import run_header

    assert run_header(1, 6, "dense", []) == "[1/6] dense: time estimate after this run"
    line = run_header(3, 6, "svd-smartformer", [120.0, 180.0])
    assert line == "[3/6] svd-smartformer: about 2.5 min, 10 min left in all"  # 150 s a run, 4 runs to go
