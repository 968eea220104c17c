"""``{"method": "shared", "source": ...}`` forms of ``method="mixed"``: a Linear that computes with another Linear's
weights (cross-layer sharing). Stored once, trained by both uses, refused when it cannot fit, kept through
``decompress`` (as two independent dense Linears) and ONNX export. Saving and loading in new processes, with and
without the library, is the contract matrix's ``mixed`` cell (``tests/test_contract.py``)."""

from __future__ import annotations

import onnx
import pytest
import torch
from helpers import tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, decompress
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.deploy.onnx import export_onnx
from hf_tensorcompress.deploy.onnx.runner import forecast, load
from hf_tensorcompress.methods.mixed.shared import SharedLinear

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "ff.0", "ff.3")
LOWBIT = {"method": "lowbit", "weight_bits": 4, "weight_group_size": 8}


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def layer_forms(shared: bool) -> dict:
    """Every encoder Linear of the tiny PatchTST at 4 bits; with ``shared`` the second layer's reuse the first's."""
    forms = {f"model.encoder.layers.0.{linear}": dict(LOWBIT) for linear in LINEARS}
    for linear in LINEARS:
        source = f"model.encoder.layers.0.{linear}"
        forms[f"model.encoder.layers.1.{linear}"] = {"method": "shared", "source": source} if shared else dict(LOWBIT)
    return forms


def past_values(model) -> torch.Tensor:
    config = model.config
    return torch.randn(2, config.context_length, config.num_input_channels, generator=torch.Generator().manual_seed(1))


def test_shared_linears_compute_with_their_source_and_store_nothing_of_their_own():
    model = apply_compression(patchtst(), CompressionConfig(method="mixed", forms=layer_forms(shared=True)))
    separate = apply_compression(patchtst(), CompressionConfig(method="mixed", forms=layer_forms(shared=False)))
    first, second = model.model.encoder.layers
    for linear in LINEARS:
        layer, source = second.get_submodule(linear), first.get_submodule(linear)
        assert isinstance(layer, SharedLinear) and layer.source_layer is source
        x = torch.randn(3, layer.in_features)
        assert torch.equal(layer(x), source(x))
        assert model.config.compression_config["modules"][f"model.encoder.layers.1.{linear}"] == {
            "type": "shared",
            "in_features": layer.in_features,
            "out_features": layer.out_features,
            "bias": True,
            "source": f"model.encoder.layers.0.{linear}",
        }
    assert not [key for key in model.state_dict() if key.startswith("model.encoder.layers.1.") and "norm" not in key]
    # the second layer's Linears cost nothing: exactly the bytes of the separate model less its second layer's
    second_layer = sum(
        row["disk"]
        for name, row in linear_bytes(separate)["modules"].items()
        if name.startswith("model.encoder.layers.1.")
    )
    assert linear_bytes(model)["disk"] == linear_bytes(separate)["disk"] - second_layer
    # both uses train the one weight: its gradient is the sum of what each layer sends it
    model.train()
    model(past_values=past_values(model)).prediction_outputs.square().mean().backward()
    source = first.self_attn.q_proj
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in source.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("model.encoder.layers.0.nope", "which this model has no module named"),
        ("model.encoder.layers.0.ff.3", "can only share a module of its own shape"),
        ("model.encoder.layers.1.ff.0", "shares itself"),
        ("model.encoder.layers.1.self_attn.q_proj", "which is itself shared; share its source directly"),
    ],
)
def test_a_share_that_cannot_fit_is_refused_before_anything_changes(source, message):
    model = patchtst()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    forms = layer_forms(shared=True)
    forms["model.encoder.layers.1.ff.0"] = {"method": "shared", "source": source}
    with pytest.raises(ValueError, match=message):
        apply_compression(model, CompressionConfig(method="mixed", forms=forms))
    assert type(model) is PatchTSTForPrediction and not hasattr(model.config, "compression_config")
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())


@pytest.mark.parametrize(
    "form",
    [
        {"method": "shared"},
        {"method": "shared", "source": ""},
        {"method": "shared", "source": "model.encoder.layers.0.ff.0", "weight_bits": 4},
    ],
)
def test_a_shared_form_names_its_source_and_nothing_else(form):
    with pytest.raises(ValueError, match="a shared form is"):
        CompressionConfig(method="mixed", forms={"model.encoder.layers.1.ff.0": form})


def test_decompress_gives_each_layer_its_own_copy_and_a_plain_checkpoint(tmp_path):
    model = apply_compression(patchtst(), CompressionConfig(method="mixed", forms=layer_forms(shared=True)))
    x = past_values(model)
    with torch.no_grad():
        expected = model(past_values=x).prediction_outputs
    dense = decompress(model)
    first, second = dense.model.encoder.layers
    assert type(second.ff[0]) is torch.nn.Linear
    assert second.ff[0].weight.data_ptr() != first.ff[0].weight.data_ptr()
    assert torch.equal(second.ff[0].weight, first.ff[0].weight)
    dense.save_pretrained(tmp_path)
    reloaded = PatchTSTForPrediction.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(past_values=x).prediction_outputs, expected, atol=1e-6, rtol=1e-6)


def test_onnx_holds_the_shared_weights_once_and_forecasts_as_torch(tmp_path):
    shared = apply_compression(patchtst(), CompressionConfig(method="mixed", forms=layer_forms(shared=True)))
    separate = apply_compression(patchtst(), CompressionConfig(method="mixed", forms=layer_forms(shared=False)))
    x = past_values(shared)
    with torch.no_grad():
        expected = shared(past_values=x).prediction_outputs.numpy()
    path = export_onnx(shared, tmp_path / "shared.onnx")
    got = forecast(load(path), x.numpy())
    assert abs(got - expected).max() < 1e-4
    stored = {
        name: sum(onnx.numpy_helper.to_array(t).nbytes for t in onnx.load(p).graph.initializer)
        for name, p in (("shared", path), ("separate", export_onnx(separate, tmp_path / "separate.onnx")))
    }
    assert stored["shared"] < stored["separate"] * 0.8, stored
