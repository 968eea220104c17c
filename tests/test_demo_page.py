"""``make demo`` and its documentation agree: the page's one-seed table is what the recipe's ``results.md`` writer
makes of the committed ``results.json`` of a ``make demo`` run (``recipes/recipekit``), and the recipe announces
each run with an estimate."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "smartformer.md"
RESULTS = ROOT / "docs" / "results" / "smartformer_demo.json"


def demo_runs() -> list[str]:
    """The run names ``make demo`` passes to the recipe (the Makefile's ``--runs``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    return re.search(r"--runs ([^\n]+)", demo).group(1).split()


def test_the_page_shows_the_table_make_demo_writes():
    from hf_tensorcompress.evaluation.pareto import kind_of

    from recipekit.forecasters import SIZES
    from recipekit.smartformer_report import markdown

    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert [run["name"] for run in results["runs"]] == demo_runs()
    assert {run["seed"] for run in results["runs"]} == {0}  # the recipe's default --seeds
    assert results["steps"] == SIZES["demo"].steps and results["model"] == "autoformer"
    # no equal-byte baseline among them, so results.md is this table alone (no Pareto section)
    assert all(kind_of(run["name"]) != "baseline" for run in results["runs"])
    assert markdown(results) in PAGE.read_text(encoding="utf-8")


def test_each_run_is_announced_with_its_index_and_an_estimate():
    from recipekit.run_headers import run_header

    assert run_header(1, 6, "dense", []) == "[1/6] dense: time estimate after this run"
    line = run_header(3, 6, "svd-smartformer", [120.0, 180.0])
    assert line == "[3/6] svd-smartformer: about 2.5 min, 10 min left in all"  # 150 s a run, 4 runs to go
