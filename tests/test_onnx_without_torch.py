"""The exported files run where only onnxruntime, numpy and tokenizers are installed: no torch, no transformers."""

import json
import subprocess

import numpy as np
import pytest
from journey_envs import build_onnx_runtime_env
from onnx_cases import (
    FORECAST_CASES,
    LM_CASES,
    PROMPT,
    WIDE_LMS,
    exported,
    saved_forecaster,
    saved_lm,
    torch_forecast,
    torch_greedy,
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
def test_runner_without_torch(tmp_path, forecaster, lm):
    python = build_onnx_runtime_env()
    patchtst = saved_forecaster(tmp_path / "patchtst", FORECAST_CASES[forecaster])
    llama = saved_lm(tmp_path / "llama", LM_CASES[lm], **({"hidden": 32} if lm in WIDE_LMS else {}))
    past = np.random.default_rng(1).standard_normal((3, 32, 3)).astype(np.float32)
    np.save(tmp_path / "past.npy", past)
    result = subprocess.run(
        [python, "-c", SCRIPT, exported(patchtst), exported(llama), tmp_path / "past.npy", json.dumps(PROMPT)],
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
