"""ONNX export: the compressed tensors stay as stored, and ONNX Runtime gives PyTorch's outputs."""

import numpy as np
import onnx
import pytest
from onnx_cases import (
    FORECAST_CASES,
    LM_CASES,
    PROMPT,
    exported,
    saved_forecaster,
    saved_lm,
    stored_tensors_kept,
    torch_forecast,
    torch_greedy,
)

from hf_tensorcompress.cli import main
from hf_tensorcompress.deploy.onnx import OnnxExportError, export_onnx
from hf_tensorcompress.deploy.onnx.runner import empty_cache, forecast, generate, load, metadata, step

FAST_FORECASTS = ("cp-int4",)
FAST_LMS = ("tiered-int4-int2",)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``get(kind, name)``: the saved folder and exported file of a case, made once per module (an export takes
    seconds)."""
    root, made = tmp_path_factory.mktemp("onnx"), {}

    def get(kind, name):
        if (kind, name) not in made:
            save = saved_forecaster if kind == "forecast" else saved_lm
            options = (FORECAST_CASES if kind == "forecast" else LM_CASES)[name]
            folder = save(root / f"{kind}-{name}", options)
            made[kind, name] = folder, exported(folder)
        return made[kind, name]

    return get


def _tiers(cases, fast):
    return [pytest.param(name, marks=() if name in fast else pytest.mark.slow) for name in cases]


@pytest.mark.parametrize("name", _tiers(FORECAST_CASES, FAST_FORECASTS))
@pytest.mark.parametrize("fold_constants", [True, False])
def test_forecast_matches_pytorch(exports, name, fold_constants):
    folder, path = exports("forecast", name)
    assert stored_tensors_kept(folder, path) == []
    past = np.random.default_rng(0).standard_normal((5, 32, 3)).astype(np.float32)
    expected = torch_forecast(folder, past)
    got = forecast(load(path, threads=1, fold_constants=fold_constants), past)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_no_dense_weight_in_the_file(exports):
    """A low-bit CP layer's file holds its codes, and no float initializer the size of a replaced weight."""
    _, path = exports("forecast", "cp-int4")
    model, replaced = onnx.load(str(path)), metadata(load(path))["compressed_modules"]
    inits = {
        prefix: [i for i in model.graph.initializer if i.name.startswith(f"model.{prefix}.")] for prefix in replaced
    }
    assert replaced and all(inits.values())
    for held in inits.values():
        assert all(np.prod(i.dims) < 32 * 32 for i in held if i.data_type == onnx.TensorProto.FLOAT)
        assert any(i.data_type == onnx.TensorProto.UINT8 for i in held)


@pytest.mark.parametrize("name", _tiers(LM_CASES, FAST_LMS))
def test_greedy_tokens_match_pytorch(exports, name):
    folder, path = exports("lm", name)
    assert stored_tensors_kept(folder, path) == []
    session = load(path, threads=1)
    expected = torch_greedy(folder, PROMPT, 16)
    assert len(set(expected)) > 1  # the tokens change, so equality says something
    assert generate(session, PROMPT, 16) == expected


def test_cache_steps_match_one_pass(exports):
    """Prefill then one step through the cache gives the logits of one pass over the whole sequence."""
    _, path = exports("lm", "tiered-int4-int2")
    session = load(path, threads=1)
    info = metadata(session)
    ids = np.asarray([PROMPT], dtype=np.int64)
    whole, _ = step(session, info, ids, empty_cache(info, 1))
    _, cache = step(session, info, ids[:, :-1], empty_cache(info, 1))
    last, cache = step(session, info, ids[:, -1:], cache)
    assert np.allclose(whole, last, atol=1e-5)
    assert next(iter(cache.values())).shape[2] == len(PROMPT)


def test_unsupported_family_is_refused(tmp_path):
    from family_models import LANGUAGE_MODELS

    model_class, config = LANGUAGE_MODELS["bert"]
    with pytest.raises(OnnxExportError, match="PatchTST"):
        export_onnx(model_class(config()), tmp_path / "x.onnx")


def test_layer_without_export_form_is_refused(tmp_path):
    """A compressed layer type with no export form is refused by its layer type, not traced into a wrong graph."""
    from helpers import tiny_causal_lm

    from hf_tensorcompress import CompressionConfig, apply_compression
    from hf_tensorcompress.methods.svd.layer import LowRankLinear

    class Unexported(LowRankLinear):
        layer_type = "svd_without_export_form"

    model = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="svd", rank=0.5))
    next(module for module in model.modules() if isinstance(module, LowRankLinear)).__class__ = Unexported
    with pytest.raises(OnnxExportError, match="svd_without_export_form"):
        export_onnx(model, tmp_path / "x.onnx")


def test_runner_refuses_the_wrong_kind(exports):
    _, path = exports("forecast", "cp-int4")
    with pytest.raises(ValueError, match="forecast model"):
        generate(load(path), PROMPT, 2)
    with pytest.raises(ValueError, match=r"\(batch, 32, 3\)"):
        forecast(load(path), np.zeros((1, 16, 3), dtype=np.float32))


@pytest.mark.slow
def test_cli_export(tmp_path, capsys):
    folder = saved_forecaster(tmp_path / "svd", FORECAST_CASES["svd-int8"])
    assert main(["export-onnx", str(folder), str(tmp_path / "out.onnx")]) == 0
    assert '"kind": "forecast"' in capsys.readouterr().out
    past = np.ones((2, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(forecast(load(tmp_path / "out.onnx"), past), torch_forecast(folder, past), rtol=1e-4)
