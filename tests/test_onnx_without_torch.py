"""The exported files run where only onnxruntime, numpy and tokenizers are installed: no torch, no transformers."""

import json
import subprocess

import numpy as np
import pytest
from onnx_cases import (
    FORECAST_CASES,
    LM_CASES,
    PROMPT,
    SEQ2SEQ_CASES,
    WIDE_LMS,
    exported,
    saved_forecaster,
    saved_lm,
    saved_seq2seq,
    seq2seq_inputs,
    torch_forecast,
    torch_greedy,
    torch_seq2seq_forecast,
)

SCRIPT = """
import importlib.util, json, sys
import numpy as np
from hf_tensorcompress.deploy.onnx.runner import forecast, generate, load
assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("transformers") is None
past = np.load(sys.argv[3])
print(json.dumps({
    "forecast": forecast(load(sys.argv[1], threads=1), past).tolist(),
    "tokens": generate(load(sys.argv[2], threads=1), json.loads(sys.argv[4]), 16),
    "torch_loaded": "torch" in sys.modules,
}))
"""


@pytest.mark.slow  # builds (once) and uses a venv of its own
@pytest.mark.parametrize(
    ("forecaster", "lm"),
    [("svd-int2", "tiered-codebook-lowrank"), ("biprop", "dense"), ("cp-int4-ortops", "tiered-ortops")],
)
def test_runner_without_torch(tmp_path, forecaster, lm, onnx_runtime_python):
    patchtst = saved_forecaster(tmp_path / "patchtst", FORECAST_CASES[forecaster])
    llama = saved_lm(tmp_path / "llama", LM_CASES[lm], **({"hidden": 32} if lm in WIDE_LMS else {}))
    past = np.random.default_rng(1).standard_normal((3, 32, 3)).astype(np.float32)
    np.save(tmp_path / "past.npy", past)
    result = subprocess.run(
        [
            onnx_runtime_python,
            "-c",
            SCRIPT,
            exported(patchtst),
            exported(llama),
            tmp_path / "past.npy",
            json.dumps(PROMPT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert not output["torch_loaded"]
    expected = torch_forecast(patchtst, past)
    assert np.abs(np.asarray(output["forecast"]) - expected).max() <= 1e-4 * np.abs(expected).max()
    assert output["tokens"] == torch_greedy(llama, PROMPT, 16)


TIME_SERIES_SCRIPT = """
import importlib.util, json, sys
import numpy as np
from hf_tensorcompress.deploy.onnx.runner import forecast, load
assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("transformers") is None
inputs = dict(np.load(sys.argv[3]))
print(json.dumps({
    "autoformer": forecast(load(sys.argv[1], threads=1), **inputs).tolist(),
    "informer": forecast(load(sys.argv[2], threads=1), **inputs).tolist(),
    "torch_loaded": "torch" in sys.modules,
}))
"""


@pytest.mark.slow  # builds (once) and uses a venv of its own
def test_time_series_runner_without_torch(tmp_path, onnx_runtime_python):
    """Autoformer's one-pass forecast and Informer's mean-feedback loop, run with numpy and onnxruntime only."""
    folders = {
        "autoformer": saved_seq2seq(tmp_path / "autoformer", "autoformer", SEQ2SEQ_CASES["cp-int4"]),
        "informer": saved_seq2seq(tmp_path / "informer", "informer", SEQ2SEQ_CASES["svd-int4"]),
    }
    inputs = seq2seq_inputs(folders["informer"], batch=3, seed=2)
    np.savez(tmp_path / "inputs.npz", **inputs)
    files = [exported(folders[name]) for name in ("autoformer", "informer")]
    result = subprocess.run(
        [onnx_runtime_python, "-c", TIME_SERIES_SCRIPT, *files, tmp_path / "inputs.npz"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert not output["torch_loaded"]
    for name, folder in folders.items():
        expected = torch_seq2seq_forecast(folder, inputs)
        assert np.abs(np.asarray(output[name]) - expected).max() <= 1e-4 * np.abs(expected).max()
