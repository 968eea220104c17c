"""Two real processes (``accelerate launch --multi_gpu --num_processes 2``, CPU, gloo) search and train together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("distributed_smartformer.py")


def test_two_processes_hold_the_same_ranks_and_keep_gradients_in_sync(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parent.parent))
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
        str(SCRIPT),
        str(tmp_path),
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    first, second = (json.loads((tmp_path / f"process-{i}.json").read_text()) for i in (0, 1))

    assert first["world_size"] == 2 and first["ddp"] == second["ddp"] == "DistributedDataParallel"
    # identical ranks on both processes after every stage, and the search really changed some
    assert first["rank_history"] == second["rank_history"]
    assert (
        [step for step, _ in first["rank_history"]]
        == first["trace_steps"]
        == [3 * (i + 1) for i in range(len(first["trace_steps"]))]
    )
    assert any(rank != 10 for _, ranks in first["rank_history"] for rank in ranks.values())
    # after the rank changes (and DDP rebuilds) gradients are still averaged: the processes saw different
    # batches, yet their parameters and the gradients of a backward on different data agree
    assert first["params"].keys() == second["params"].keys()
    for name, value in first["params"].items():
        assert second["params"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert first["grads"].keys() == second["grads"].keys() and first["grads"]
    for name, value in first["grads"].items():
        assert second["grads"][name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
    assert (tmp_path / "smartformer_trace.json").exists()


@pytest.mark.slow
def test_two_processes_hold_the_same_ranks_and_widths_in_the_byte_search(tmp_path):
    """The byte search under DDP: both processes apply the same rank and factor-width changes and stay in sync."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parent.parent))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(SCRIPT), str(tmp_path), "bytes"]  # fmt: skip
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    first, second = (json.loads((tmp_path / f"process-{i}.json").read_text()) for i in (0, 1))
    assert first["rank_history"] == second["rank_history"] and first["bits_history"] == second["bits_history"]
    assert first["factor_bits"] == second["factor_bits"] and set(first["factor_bits"].values()) & {8, 4, 2}
    for name, value in first["params"].items():
        assert second["params"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), name


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forms", "shares", "shared"])
def test_two_processes_hold_the_same_forms_in_the_search_over_forms(tmp_path, mode):
    """The search over forms under DDP: both processes swap the same Linears into the same forms (new modules, new
    parameters, the DDP wrapper rebuilt) and their parameters stay equal; with the sensitivity shares the main process
    measures every Linear once, on validation windows, both move to the greedy allocation by it at the first stage
    (``start="greedy"``) and the other follows the main one's decisions; with a shared layer both
    hold its Linears as shares of the first layer's, whatever form those took."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SCRIPT.parent.parent))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), str(tmp_path),
               mode]  # fmt: skip
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    first, second = (json.loads((tmp_path / f"process-{i}.json").read_text()) for i in (0, 1))
    assert first["chosen"] == second["chosen"] and first["types"] == second["types"]
    assert {"LowBitLinear", "LowRankLinear", "CPLinear", "BipropLinear"} & set(first["types"].values())
    assert first["params"].keys() == second["params"].keys()
    for name, value in first["params"].items():
        assert second["params"][name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    if mode == "shares":  # measured once, on the main process: one share for every Linear the search holds
        assert len(first["shares"]) == 1 and set(first["shares"][0]) == set(first["searched"])
        assert all(share > 0 for share in first["shares"][0].values())
        assert len(first["greedy"]) == 1 and first["greedy"] == second["greedy"]
        assert first["chosen"][0] == first["greedy"][0] and set(first["greedy"][0]) == set(first["searched"])
    if mode == "shared":
        shares = {name for name, kind in first["types"].items() if kind == "SharedLinear"}
        assert len(shares) == 6 and not shares & set(first["searched"])
