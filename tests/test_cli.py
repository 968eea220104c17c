"""The real ``hf-tensorcompress`` console script, run as a subprocess on small saved models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from test_hub_push import RESULTS, small_patchtst

ROOT = Path(__file__).resolve().parents[1]
# The script installed beside this interpreter (`make test` runs .venv/bin/python without activating the venv).
_BESIDE = Path(sys.executable).parent / "hf-tensorcompress"
SCRIPT = str(_BESIDE) if _BESIDE.is_file() else shutil.which("hf-tensorcompress")


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the installed console script against this checkout's code."""
    assert SCRIPT, "the hf-tensorcompress console script is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, one ``error:`` line on stderr, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hf-tensorcompress ") and ": error: " in last
    for fragment in fragments:
        assert fragment in last, last


@pytest.fixture(scope="module")
def dense_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dense")
    small_patchtst().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def compressed_folder(dense_folder, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("cli") / "svd"
    result = cli("compress", str(dense_folder), str(output), "--method", "svd", "--rank", "4")
    assert f"saved compressed model (svd, 6 modules, the rest in float32) to {output}" in result.stdout
    assert "size on disk: " in result.stdout.splitlines()[-1]
    return output


def test_compress_saves_a_self_contained_checkpoint_with_card(dense_folder, compressed_folder):
    config = json.loads((compressed_folder / "config.json").read_text())
    assert config["compression_config"]["method"] == "svd" and config["compression_config"]["rank"] == 4
    assert {"modeling_tensorcompress.py", "svd_layer.py", "model.safetensors"} <= {
        p.name for p in compressed_folder.iterdir()
    }
    card = ModelCard((compressed_folder / "README.md").read_text())
    assert card.data.tags[:3] == ["hf_tensorcompress", "compressed", "svd"]
    from hf_tensorcompress.loading import load_model

    dense, compressed = load_model(dense_folder).eval(), load_model(compressed_folder).eval()
    inputs = torch.randn(2, 32, 3)
    with torch.no_grad():  # rank 4 of 16: close to, not equal to, the dense model
        assert (
            compressed(past_values=inputs).prediction_outputs.shape
            == dense(past_values=inputs).prediction_outputs.shape
        )


@pytest.mark.slow
def test_compress_from_a_config_file_and_user_errors(dense_folder, tmp_path):
    (tmp_path / "cp.json").write_text(json.dumps({"method": "cp", "rank": 2, "cp_iterations": 3}))
    cli("compress", str(dense_folder), str(tmp_path / "cp"), "--config", str(tmp_path / "cp.json"))
    assert json.loads((tmp_path / "cp" / "config.json").read_text())["compression_config"]["rank"] == 2

    assert_user_error(
        cli("compress", str(dense_folder), str(tmp_path / "bad"), "--rank", "7.5", check=False),
        "--rank 7.5 is outside (0, 1]",
    )
    assert not (tmp_path / "bad").exists()
    assert_user_error(cli("compress", str(tmp_path / "nowhere"), str(tmp_path / "out"), check=False), "does not exist")


def test_report_prints_every_module_and_the_totals(compressed_folder):
    table = cli("report", str(compressed_folder), "--tokens", "8").stdout
    lines = table.splitlines()
    assert sum(line.startswith("model.encoder.layers.") for line in lines) == 6
    assert lines[0].split()[:3] == ["module", "type", "path"]  # the inference path of every module
    assert all(line.split()[2] in ("factorized", "reconstruct") for line in lines if line.startswith("model."))
    assert any(line.startswith("total ") for line in lines) and "estimated energy" in table
    report = json.loads(cli("report", str(compressed_folder), "--tokens", "8", "--json").stdout)
    assert report["method"] == "svd" and report["tokens"] == 8 and len(report["modules"]) == 6
    assert {module["path"] for module in report["modules"]} == {"factorized"}  # rank 4 of 16
    assert report["targets"]["params"] < report["targets"]["dense_params"]


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_push_uploads_model_code_and_card(hub, repo_id, compressed_folder, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    result = cli(
        "push",
        str(compressed_folder),
        repo_id,
        "--results",
        str(tmp_path / "results.json"),
        "--run",
        "compressed",
        "--dataset-note",
        "UCI Appliances Energy (a substitute for ETTh1)",
    )
    assert f"/{repo_id}/commit/" in result.stdout
    files = hub.files(repo_id)
    assert {"config.json", "model.safetensors", "modeling_tensorcompress.py", "svd_layer.py", "README.md"} <= set(files)
    card = ModelCard(files["README.md"].decode())
    assert "| **compressed** (this model) | 1 | 0.571 | 0.655 |" in card.text
    assert f'AutoModel.from_pretrained("{repo_id}", trust_remote_code=True)' in card.text

    refused = cli("push", str(compressed_folder), "someone-else/model", check=False)
    assert_user_error(refused, "Could not push to 'someone-else/model' (HTTP 403)")


def test_fetch_returns_the_cached_asset_and_rejects_unknown_names():
    from hf_tensorcompress import assets

    path = Path(cli("fetch", "appliances_energy").stdout.split(": ", 1)[1].strip())
    assert path == assets.asset_dir("appliances_energy") and (path / "minute_energy_appliance.csv.xz").is_file()
    assert_user_error(cli("fetch", "imagenet", check=False), "unknown asset(s) ['imagenet']")


@pytest.mark.slow
def test_evaluate_puts_dense_and_compressed_runs_side_by_side(tmp_path):
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    from hf_tensorcompress import CompressionConfig, apply_compression

    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=26,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        num_attention_heads=2,
        num_hidden_layers=1,
        ffn_dim=32,
    )
    model = PatchTSTForPrediction(config)
    model.save_pretrained(tmp_path / "dense")
    apply_compression(model, CompressionConfig(method="svd", rank=16)).save_pretrained(tmp_path / "svd")  # full rank
    results = tmp_path / "results.json"
    cli("evaluate", str(tmp_path / "dense"), "--output", str(results), "--stride", "97")
    printed = json.loads(cli("evaluate", str(tmp_path / "svd"), "--output", str(results), "--stride", "97").stdout)
    assert printed == json.loads(results.read_text())
    assert printed["dataset"] == "appliances_energy" and printed["split"] == "test"
    dense, compressed = printed["runs"]
    assert (dense["name"], compressed["name"]) == ("dense", "compressed") and dense["windows"] == compressed[
        "windows"
    ] > 0
    for metric in ("mse", "mae"):  # full-rank SVD is the dense model
        assert compressed["metrics"][metric] == pytest.approx(dense["metrics"][metric], rel=1e-5)

    other = tmp_path / "other.csv"
    assert_user_error(
        cli("evaluate", str(tmp_path / "svd"), "--output", str(results), "--dataset", str(other), check=False),
        "holds results on 'appliances_energy'",
    )
