"""recipes/byte_table_gpu.sh, run on the CPU with a few steps: one process per (data set, seed, group of arms), a
finished folder skipped when the command runs again, DEADLINE stopping what would run past it, and the finished
folders merged into one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "recipes" / "byte_table_gpu.sh"


def table(out: Path, seeds: list[str], **env: str) -> subprocess.CompletedProcess:
    settings = dict(DEVICE="cpu", STEPS="8", DATASETS="electricity", POOL="2", PYTHON=sys.executable, **env)
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), *seeds], env=os.environ | settings, capture_output=True, text=True, timeout=600
    )


def arms(out: Path) -> dict[str, list[int]]:
    merged = json.loads((out / "comparison.json").read_text())["results"]["electricity"]["arms"]
    return {name: arm["seeds"] for name, arm in merged.items() if not name.startswith("naive")}


@pytest.mark.slow
def test_groups_run_apart_merge_and_are_not_run_twice(tmp_path):
    out = tmp_path / "table"
    first = table(out, ["0"], RUN_GROUPS="dense,ptq-int8-all qat-int2-all")
    assert first.returncode == 0, first.stderr[-2000:]
    assert sorted(path.name for path in out.glob("*.log")) == [
        "electricity-seed0-dense+ptq-int8-all.log",
        "electricity-seed0-qat-int2-all.log",
    ]
    assert arms(out) == {"dense": [0], "ptq-int8-all": [0], "qat-int2-all": [0]}
    again = table(out, ["0"], RUN_GROUPS="dense,ptq-int8-all qat-int2-all")
    assert again.returncode == 0, again.stderr[-2000:]
    assert ".log" not in again.stdout  # no run started: each folder had finished
    assert arms(out) == {"dense": [0], "ptq-int8-all": [0], "qat-int2-all": [0]}


@pytest.mark.slow
def test_deadline_stops_the_unfinished_and_merges_the_finished(tmp_path):
    out = tmp_path / "table"
    assert table(out, ["0"], RUN_GROUPS="dense").returncode == 0
    cut = table(out, ["0", "1"], RUN_GROUPS="dense", DEADLINE="3")  # seed 1 starts, then is stopped at 3 s
    assert cut.returncode == 1
    assert "stopped at DEADLINE" in cut.stdout and "electricity-seed1-dense" in cut.stdout
    assert "did not finish; run the command again" in cut.stderr
    assert not (out / "electricity-seed1-dense" / "comparison.json").exists()
    assert arms(out) == {"dense": [0]}  # the table holds the finished seed alone
