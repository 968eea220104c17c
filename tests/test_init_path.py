"""Compressed layers initialise through the model's own per-module init path (``_init_weights``), as transformers'
model tests and ``from_pretrained`` call it: every tensor is filled, and the same seed gives the same layer."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression

CONFIGS = {
    "cp": {"method": "cp", "rank": 2, "init": "random"},
    "svd": {"method": "svd", "rank": 2},
    "biprop": {"method": "biprop"},
    "tt": {"method": "tt", "tt_order": 3, "tt_ranks": 2},
}


def compressed(method: str):
    torch.manual_seed(0)
    dense = tiny_causal_lm("llama") if method == "tt" else PatchTSTForPrediction(tiny_patchtst_config())
    return apply_compression(dense, CONFIGS[method])


@pytest.mark.parametrize("method", list(CONFIGS))
def test_init_weights_fills_every_tensor_of_a_compressed_layer(method):
    model = compressed(method)
    layer = model.get_submodule(next(iter(model.config.compression_config["modules"])))
    with torch.no_grad():
        for tensor in layer.state_dict().values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
    states = []
    for _ in range(2):
        torch.manual_seed(3)
        model._init_weights(layer)
        states.append({k: v.clone() for k, v in layer.state_dict().items()})
    assert all(torch.isfinite(t.float()).all() for t in states[0].values())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])  # seeded like transformers' test


def test_biprop_takes_init_random_and_builds_on_the_meta_device_through_the_model_init():
    """Code that passes ``init="random"`` to every method (transformers' meta-device model tests) works for biprop."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = PatchTSTForPrediction(tiny_patchtst_config())
    apply_compression(model, CompressionConfig(method="biprop", keep_ratio=0.5, init="random"))
    model.to_empty(device="cpu")
    model.initialize_weights()
    with torch.no_grad():
        out = model(past_values=torch.randn(2, 32, 3)).prediction_outputs
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="signs always come from weight_seed"):
        CompressionConfig(method="biprop", init="decompose")


def test_a_version_1_biprop_config_with_the_flat_init_field_still_loads():
    old = {"method": "biprop", "version": 1, "init": "decompose", "rank": 0.5, "keep_ratio": 0.25}
    config = CompressionConfig.from_dict(old)
    assert config.method == "biprop" and config.init == "random" and config.keep_ratio == 0.25
