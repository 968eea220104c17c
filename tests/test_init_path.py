"""Compressed layers initialise through the model's own per-module init path (``_init_weights``), as transformers'
model tests and ``from_pretrained`` call it: every tensor is filled, and the same seed gives the same layer."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import apply_compression

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
