"""``method="lowbit"`` with ``weight_scales="learned"``: group scales (and minima) trained with the weights (LSQ),
computing what storage holds, saved in the usual packed form and loaded back (a new process, a resumed run) to the
outputs the trained layer gave."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from tests.helpers import run_without_library, tiny_patchtst_config

#: (bits, group size): 48 does not divide the 32 inputs, so those rows are one group each, as storage groups them
WIDTHS = [(2, 8), (3, 16), (4, None), (8, 8), ("ternary", 8), ("ternary", None), (2, 48), ("ternary", 48), (1, 8)]


def trained_layer(bits, group, steps: int = 20) -> LowBitLinear:
    """A learned-scale layer after a few Adam steps towards a random target: its scales have moved."""
    torch.manual_seed(0)
    layer = LowBitLinear(32, 12, bits, group, learned_scales=True)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    x, target = torch.randn(16, 32), torch.randn(16, 12)
    for _ in range(steps):
        optimizer.zero_grad()
        (layer(x) - target).pow(2).mean().backward()
        optimizer.step()
    return layer


@pytest.mark.parametrize("bits,group", WIDTHS)
def test_the_weight_is_what_the_stored_form_decodes_and_the_scales_move(bits, group):
    layer = trained_layer(bits, group)
    start = LowBitLinear(32, 12, bits, group, learned_scales=True)
    start.latent.data.copy_(layer.latent.data)
    start.start_scales()
    assert not torch.equal(layer.scale, start.scale)  # trained away from where they started
    if bits != "ternary":
        assert not torch.equal(layer.minimum, start.minimum)
    with torch.no_grad():
        assert torch.equal(layer.weight, layer.packed().dequantize())
        stored_scale = layer.packed().scale
    assert torch.equal(stored_scale, layer.scale.detach().abs().half())  # the learned scales are what is stored


@pytest.mark.parametrize("bits,group", [(2, 8), (4, None), (1, 8)])
def test_learning_starts_from_the_rounded_weights(bits, group):
    """Integer codes start exactly where rounding against the weights' range (1 bit: ±mean|x|) puts them."""
    torch.manual_seed(1)
    learned, rounded = LowBitLinear(32, 12, bits, group, learned_scales=True), LowBitLinear(32, 12, bits, group)
    rounded.latent.data.copy_(learned.latent.data)
    with torch.no_grad():
        assert torch.equal(learned.weight, rounded.weight)


def test_the_gradients_are_lsq_s():
    """Straight-through inside the clipped range and nothing outside it for the weights; the scale's gradient is
    the rounding error's, times 1/sqrt(group · top code)."""
    layer = LowBitLinear(8, 1, 2, None, learned_scales=True)
    with torch.no_grad():
        layer.latent.copy_(torch.tensor([[-1.0, -0.4, -0.1, 0.0, 0.2, 0.35, 0.6, 2.0]]))
        layer.scale.fill_(0.25)
        layer.minimum.fill_(-0.5)
    layer.weight.sum().backward()
    position = (layer.latent.detach() + 0.5) / 0.25
    inside = (position >= 0) & (position <= 3)
    torch.testing.assert_close(layer.latent.grad, inside.float())
    expected = (torch.round(position.clamp(0, 3)) - torch.where(inside, position, 0.0)).sum() / math.sqrt(8 * 3)
    torch.testing.assert_close(layer.scale.grad.squeeze(), expected)


def test_a_trained_model_saves_packed_resumes_and_loads_in_new_processes_with_and_without_the_library(tmp_path):
    torch.manual_seed(0)
    model = PatchTSTForPrediction(tiny_patchtst_config())
    apply_compression(
        model, CompressionConfig(method="lowbit", weight_bits="ternary", weight_group_size=8, weight_scales="learned")
    )
    layers = [m for m in model.modules() if isinstance(m, LowBitLinear)]
    assert layers and all(layer.learned_scales for layer in layers)
    x = torch.randn(2, model.config.context_length, model.config.num_input_channels)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(5):
        optimizer.zero_grad()
        model(past_values=x).prediction_outputs.pow(2).mean().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        expected = model(past_values=x).prediction_outputs
    saved = model.state_dict()
    assert not any(key.endswith((".latent", ".scale", ".minimum")) and "stored_weight" not in key for key in saved)

    fresh = PatchTSTForPrediction(tiny_patchtst_config())  # a resumed run: the trainable form reads the codes back
    apply_compression(
        fresh, CompressionConfig(method="lowbit", weight_bits="ternary", weight_group_size=8, weight_scales="learned")
    )
    fresh.load_state_dict(saved)
    with torch.no_grad():
        assert torch.equal(fresh.eval()(past_values=x).prediction_outputs, expected)

    model.save_pretrained(tmp_path / "model")
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    check = """
        import torch
        from hf_tensorcompress import load_model
        io = torch.load("io.pt")
        model = load_model("model").eval()
        assert all(m.stored for m in model.modules() if type(m).__name__ == "LowBitLinear")
        with torch.no_grad():
            torch.testing.assert_close(model(past_values=io["x"]).prediction_outputs, io["expected"], rtol=1e-5, atol=1e-6)
        print("ok")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(check)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
    run_without_library(
        f"""
        import os, torch
        os.environ["HF_MODULES_CACHE"] = {str(tmp_path / "modules")!r}
        from transformers import AutoModel
        io = torch.load({str(tmp_path / "io.pt")!r})
        model = AutoModel.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True).eval()
        assert "hf_tensorcompress" not in type(model).__module__
        with torch.no_grad():
            torch.testing.assert_close(model(past_values=io["x"]).prediction_outputs, io["expected"], rtol=1e-5, atol=1e-6)
        """,
        tmp_path,
    )


def test_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="weight_bits=16 .* has none; choose weight_bits 8, 4, 3, 2, 'ternary' or 1"):
        CompressionConfig(method="lowbit", weight_bits=16, weight_scales="learned").validate()
    with pytest.raises(ValueError, match="choose one of \\['rounded', 'learned'\\]"):
        CompressionConfig(method="lowbit", weight_scales="lsq").validate()
    with pytest.raises(ValueError, match="bfloat16 .* which has no scales"):
        LowBitLinear(8, 4, 16, None, learned_scales=True)
    with pytest.raises(ValueError, match="bfloat16 \\(bits=16\\) has no scales"):
        LowBitLinear(8, 4, 2, None, learned_scales=True).set_bits(16)


def test_a_width_change_starts_new_scales_from_the_weights_and_names_the_replaced_parameters():
    """The scales learned at 2 bits in groups of 8 mean nothing at ternary in groups of 16: new parameters (the
    optimizer must take them) start where a fresh layer of that width would, from the trained weight."""
    layer = trained_layer(2, 8)
    old = (layer.scale, layer.minimum)
    assert layer.set_bits(2, 8) == {} and layer.scale is old[0]  # the same width keeps its learned scales
    replaced = layer.set_bits("ternary", 16)
    assert list(replaced) == list(old) and list(replaced.values()) == [layer.scale, layer.minimum]
    assert layer.scale.shape == (12, 2) and all(p.requires_grad for p in replaced.values())
    fresh = LowBitLinear(32, 12, "ternary", 16, learned_scales=True)
    with torch.no_grad():
        fresh.latent.copy_(layer.latent)
        fresh.bias.copy_(layer.bias)
    fresh.start_scales()
    torch.testing.assert_close(layer.weight, fresh.weight)
    assert LowBitLinear(8, 4, 2, 8).set_bits(4) == {}  # rounded scales: nothing replaced
