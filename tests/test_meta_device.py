"""Every method builds on the meta device and initialises through the model's own init path (transformers builds
every model on the meta device and fills what a checkpoint lacks with ``initialize_weights`` → ``_init_weights``);
``apply_compression`` on a meta-device model builds what needs no weights and refuses what does."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.runtime.contract import CompressedLayer

CASES = {
    "cp": dict(method="cp", rank=0.5, cp_iterations=2),
    "svd": dict(method="svd", rank=0.5),
    "biprop": dict(method="biprop", attention="qkv_mask"),
    "lowbit": dict(method="lowbit", weight_bits=4, init="random"),
    "tt": dict(method="tt", tt_order=3, tt_ranks=2),
}


def dense(method: str):
    if method == "tt":
        return tiny_causal_lm("llama")
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def on_meta(build):
    with torch.device("meta"):
        return build()


def layers_of(model) -> dict[str, CompressedLayer]:
    return {name: model.get_submodule(name) for name in model.config.compression_config["modules"]}


@pytest.mark.parametrize("method", list(CASES))
def test_built_on_the_meta_device_then_initialised_by_the_model(method):
    applied = apply_compression(dense(method), CompressionConfig(**CASES[method]))
    model = on_meta(lambda: type(applied)(applied.config))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    model.to_empty(device="cpu")
    model.initialize_weights()
    for name, layer in layers_of(model).items():
        state = layer.state_dict()
        assert all(torch.isfinite(t.float()).all() for t in state.values()), name
        if method == "biprop":  # seeded: the init equals the layer as apply_compression built it
            reference = applied.get_submodule(name)
            assert torch.equal(layer.mask_bits, reference.mask_bits) and torch.equal(layer.alpha, reference.alpha)
        elif method == "tt":
            assert torch.equal(layer.token_ranks, torch.full_like(layer.token_ranks, 2))
            assert 0.5 < float(layer.weight.std()) < 2.0  # unit-variance rows, like nn.Embedding
        else:
            expected = (1 / (3 * layer.in_features)) ** 0.5  # nn.Linear's default weight std
            assert 0.4 * expected < float(layer.weight.std()) < 2.5 * expected
    if method == "biprop":
        name = model.config.compression_config["attention_modules"][0]
        assert torch.equal(model.get_submodule(name).sbt_qkv_mask, applied.get_submodule(name).sbt_qkv_mask)
    if method == "tt":
        assert torch.isfinite(model(torch.tensor([[3, 4, 5]])).logits).all()
    else:
        assert torch.isfinite(model(past_values=torch.randn(2, 32, 3)).prediction_outputs).all()


@pytest.mark.parametrize("method, options", [("cp", {}), ("svd", {}), ("tt", {})])
def test_apply_on_a_meta_model_refuses_what_needs_the_weights(method, options):
    model = on_meta(lambda: dense(method))
    before = (type(model), sorted(model.state_dict()), model.config.to_json_string())
    with pytest.raises(ValueError, match="meta device.*quantization_config=config"):
        apply_compression(model, CompressionConfig(**CASES[method], **options))
    assert (type(model), sorted(model.state_dict()), model.config.to_json_string()) == before


@pytest.mark.parametrize("method", ["cp", "svd", "biprop"])
def test_apply_on_a_meta_model_builds_what_needs_no_weights(method):
    options = {**CASES[method], **({"init": "random"} if method != "biprop" else {})}
    model = apply_compression(on_meta(lambda: dense(method)), CompressionConfig(**options))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    model.to_empty(device="cpu")
    model.initialize_weights()
    reference = apply_compression(dense(method), CompressionConfig(**options))
    for name, layer in layers_of(model).items():
        assert all(torch.isfinite(t.float()).all() for t in layer.state_dict().values()), name
        if method == "biprop":  # the frozen weights and scores come from the layer's seed, on any device
            built = reference.get_submodule(name)
            assert torch.equal(layer.frozen_weight, built.frozen_weight) and torch.equal(layer.scores, built.scores)
