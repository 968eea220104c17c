"""ONNX export of Autoformer (one forward) and Informer (teacher-forced graph, mean feedback in the runner): the
stored tensors stay as stored, and ONNX Runtime gives the PyTorch reference forecast. Slow tier: each export takes
tens of seconds, and the fast tier already exports a PatchTST (tests/test_onnx_export.py)."""

import numpy as np
import pytest
from helpers import tiny_time_series
from onnx_cases import (
    SEQ2SEQ_CASES,
    exported,
    saved_seq2seq,
    seq2seq_inputs,
    stored_tensors_kept,
    torch_seq2seq_forecast,
)

from hf_tensorcompress.deploy.onnx import OnnxExportError, export_onnx
from hf_tensorcompress.deploy.onnx.runner import forecast, load, metadata

FAST = ("informer", "cp-int4")
FAMILIES = ("autoformer", "informer")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``get(family, name)``: the saved folder and exported file of a case, made once per module."""
    root, made = tmp_path_factory.mktemp("onnx-ts"), {}

    def get(family, name):
        if (family, name) not in made:
            folder = saved_seq2seq(root / f"{family}-{name}", family, SEQ2SEQ_CASES[name])
            made[family, name] = folder, exported(folder)
        return made[family, name]

    return get


CASES = [(family, name) for family in FAMILIES for name in SEQ2SEQ_CASES]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "name"), CASES)
def test_forecast_matches_pytorch(exports, family, name):
    folder, path = exports(family, name)
    assert stored_tensors_kept(folder, path) == []
    inputs = seq2seq_inputs(folder, batch=4, seed=0)
    expected = torch_seq2seq_forecast(folder, inputs)
    got = forecast(load(path, threads=1), **inputs)
    assert got.shape == expected.shape == (4, 8, 2)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.slow
def test_informer_graph_gives_the_distribution(exports):
    """Fed its own forecast, the teacher-forced graph returns it again, with the Student-t parameters whose mean it
    is (``scaler_loc + scaler_scale · loc``, degrees of freedom above 2)."""
    _, path = exports(*FAST)
    session = load(path, threads=1)
    inputs = seq2seq_inputs(path.parent, batch=2, seed=1)
    mean = forecast(session, **inputs)
    outputs = dict(zip(metadata(session)["outputs"], session.run(None, {**inputs, "future_values": mean})))
    np.testing.assert_allclose(outputs["forecast"], mean, rtol=1e-5, atol=1e-6)
    rebuilt = outputs["scaler_loc"] + outputs["scaler_scale"] * outputs["distribution_loc"]
    np.testing.assert_allclose(rebuilt, mean, rtol=1e-5, atol=1e-6)
    assert (outputs["distribution_df"] > 2).all()


@pytest.mark.slow
def test_runner_checks_the_inputs(exports):
    _, path = exports(*FAST)
    session, inputs = load(path), seq2seq_inputs(path.parent, batch=1, seed=0)
    with pytest.raises(ValueError, match="future_time_features"):
        forecast(session, inputs["past_values"], past_time_features=inputs["past_time_features"])
    with pytest.raises(ValueError, match=r"past_values has shape \(1, 10, 2\)"):
        forecast(session, **{**inputs, "past_values": inputs["past_values"][:, :10]})


def test_probsparse_informer_is_refused(tmp_path):
    with pytest.raises(OnnxExportError, match='attention_type="prob"'):
        export_onnx(tiny_time_series("informer"), tmp_path / "x.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_univariate_with_static_features(tmp_path, family):
    """A univariate target (no channel axis) and static categorical and real features, as in the tourism models."""
    import torch
    from transformers import AutoformerConfig, AutoformerForPrediction, InformerConfig, InformerForPrediction

    from hf_tensorcompress import CompressionConfig, apply_compression

    options = dict(prediction_length=6, context_length=12, input_size=1, lags_sequence=[1, 4], num_time_features=2)
    options |= dict(num_static_categorical_features=1, cardinality=[3], embedding_dimension=[2])
    options |= dict(num_static_real_features=1, d_model=16, encoder_layers=2, decoder_layers=1)
    torch.manual_seed(0)
    if family == "autoformer":
        model = AutoformerForPrediction(AutoformerConfig(**options, label_length=4))
    else:
        model = InformerForPrediction(InformerConfig(**options, attention_type="full"))
    apply_compression(model.eval(), CompressionConfig(method="svd", rank=0.5, factor_bits=4))
    model.save_pretrained(tmp_path / family)
    rng = np.random.default_rng(3)
    inputs = {
        "past_values": rng.standard_normal((3, 16)).astype(np.float32),
        "past_time_features": rng.standard_normal((3, 16, 2)).astype(np.float32),
        "past_observed_mask": np.ones((3, 16), dtype=np.float32),
        "future_time_features": rng.standard_normal((3, 6, 2)).astype(np.float32),
        "static_categorical_features": np.asarray([[0], [2], [1]], dtype=np.int64),
        "static_real_features": rng.standard_normal((3, 1)).astype(np.float32),
    }
    expected = torch_seq2seq_forecast(tmp_path / family, inputs)
    got = forecast(load(exported(tmp_path / family), threads=1), **inputs)
    assert got.shape == expected.shape == (3, 6)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
