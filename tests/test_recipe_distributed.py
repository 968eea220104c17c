"""The main job under ``accelerate launch --num_processes 2`` in the setting where ranks matter (``--size medium``:
PatchTST d_model 128, 8 heads, on the built-in hourly electricity data, a two-week context, budget 0.2): every
process ends with the same ranks, and a fresh launch that resumes from a mid-search checkpoint ends exactly where
the uninterrupted run did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smartformer.py"
RUN = Path("runs") / "smartformer-seed0"


def launch(output_dir: Path, *extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        "0",  # a free port: other runs (xdist workers, other checkouts) may launch at the same time
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(RECIPE),
        "--model",
        "patchtst",
        "--size",
        "medium",
        "--dataset",
        "electricity",
        "--context",
        "336",
        "--budget",
        "0.2",
        "--steps",
        "96",
        "--runs",
        "smartformer",
        "--save-steps",
        "24",
        "--output-dir",
        str(output_dir),
        *extra,
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((output_dir / "results.json").read_text())


@pytest.mark.slow  # two 2-process launches of the medium setting (~3 min each on 2 CPU cores)
def test_two_processes_share_ranks_and_resume_from_mid_search_equals_the_uninterrupted_run(tmp_path):
    reference = launch(tmp_path / "uninterrupted")
    (run,) = reference["runs"]
    assert (
        len(run["ranks_per_process"]) == 2
        and run["ranks_per_process"][0] == run["ranks_per_process"][1] == run["ranks"]
    )

    checkpoint = tmp_path / "uninterrupted" / RUN / "checkpoint-24"
    state = json.loads((checkpoint / "search_state.json").read_text())
    assert len(state["decided"]) < len(run["ranks"]), "checkpoint-24 must be taken while the search still runs"
    # a fresh launch that only has the mid-search checkpoint (as after a crash at step 24 or later)
    shutil.copytree(checkpoint, tmp_path / "resumed" / RUN / "checkpoint-24")
    resumed = launch(tmp_path / "resumed", "--resume")
    (again,) = resumed["runs"]
    assert again["resumed_from"] == "checkpoint-24"
    assert again["ranks_per_process"][0] == again["ranks_per_process"][1] == again["ranks"] == run["ranks"]
    trace = [
        json.loads((tmp_path / name / "smartformer_trace.json").read_text()) for name in ("uninterrupted", "resumed")
    ]
    strip = lambda records: [{k: r[k] for k in ("step", "ranks", "changes", "decided")} for r in records]  # noqa: E731
    assert strip(trace[0]) == strip(trace[1]) and trace[0][-1]["done"]
    for key in ("mse", "mae"):
        assert again["metrics"][key] == pytest.approx(run["metrics"][key], rel=1e-4)
