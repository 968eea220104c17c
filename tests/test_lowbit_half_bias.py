"""``method="lowbit"`` with ``bias_dtype="float16"``: the bias trained as fp16 rounds it (straight-through), saved and
loaded in fp16 whatever the model's dtype, counted at 16 bits, and the same outputs once loaded in a new process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, decompress
from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from tests.helpers import tiny_patchtst_config

CONFIG = dict(method="lowbit", weight_bits="ternary", weight_group_size=8, bias_dtype="float16")


def model_with_bias_off_the_fp16_grid(**options) -> PatchTSTForPrediction:
    """A tiny PatchTST, compressed, whose biases hold values fp16 cannot (so the rounding shows)."""
    torch.manual_seed(0)
    model = PatchTSTForPrediction(tiny_patchtst_config())
    model = apply_compression(model, CompressionConfig(**{**CONFIG, **options}))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LowBitLinear):
                module.bias.copy_(torch.randn_like(module.bias) * 0.1 + 1e-4 / 3)
    return model.eval()


def lowbit_layers(model: torch.nn.Module) -> list[LowBitLinear]:
    return [module for module in model.modules() if isinstance(module, LowBitLinear)]


def test_the_layer_adds_the_bias_as_fp16_rounds_it_and_its_gradient_flows():
    torch.manual_seed(0)
    half = LowBitLinear(16, 8, "ternary", 8, half_bias=True)
    with torch.no_grad():
        half.bias.copy_(torch.full((8,), 1 + 2**-13))  # between two fp16 values near 1 (step 2**-10)
    x = torch.randn(3, 16)
    expected = x @ half.weight.detach().T + 1.0
    with torch.no_grad():
        assert torch.equal(half(x), expected)  # the packed product's path
    output = half(x)  # the training path
    assert torch.equal(output.detach(), expected)
    output.sum().backward()
    assert torch.equal(half.bias.grad, torch.full((8,), 3.0))  # straight through the rounding
    resumed = LowBitLinear(16, 8, "ternary", 8, half_bias=True)  # a Trainer resume: the trainable form reads it back
    resumed.load_state_dict(half.state_dict())
    assert half.state_dict()["bias"].dtype == torch.float16 and torch.equal(resumed.bias, torch.ones(8))


def test_saved_in_fp16_counted_at_16_bits_and_kept_in_fp16_through_dtype_changes(tmp_path):
    model = model_with_bias_off_the_fp16_grid()
    plain = model_with_bias_off_the_fp16_grid(bias_dtype="model")
    biases = sum(layer.out_features for layer in lowbit_layers(model))
    fp32_bits, fp16_bits = (sum(layer.storage_bits() for layer in lowbit_layers(m)) for m in (plain, model))
    assert fp32_bits - fp16_bits == 16 * biases  # fp32 biases: 32 bits each, fp16: 16
    model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    names = [name for name, module in model.named_modules() if isinstance(module, LowBitLinear)]
    assert {tensors[name + ".bias"].dtype for name in names} == {torch.float16}
    modules = json.loads((tmp_path / "config.json").read_text())["compression_config"]["modules"]
    assert {spec.get("bias_dtype") for spec in modules.values()} == {"float16"}
    loaded = PatchTSTForPrediction.from_pretrained(tmp_path)
    assert all(layer.stored and layer.bias.dtype == torch.float16 for layer in lowbit_layers(loaded))
    loaded.to(torch.float64).float()
    assert {layer.bias.dtype for layer in lowbit_layers(loaded)} == {torch.float16}


def test_a_new_process_gives_the_outputs_the_trained_model_gave_and_decompress_keeps_them(tmp_path):
    model = model_with_bias_off_the_fp16_grid()
    past = torch.randn(2, 32, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(past_values=past).prediction_outputs
        dense = decompress(model_with_bias_off_the_fp16_grid())(past_values=past).prediction_outputs
    torch.testing.assert_close(dense, expected)  # the dense product of the same weights and rounded bias
    model.save_pretrained(tmp_path / "model")
    torch.save({"past": past, "expected": expected}, tmp_path / "reference.pt")
    script = textwrap.dedent(
        f"""
        import torch, hf_tensorcompress
        from transformers import PatchTSTForPrediction
        reference = torch.load({str(tmp_path / "reference.pt")!r})
        model = PatchTSTForPrediction.from_pretrained({str(tmp_path / "model")!r}).eval()
        with torch.no_grad():
            output = model(past_values=reference["past"]).prediction_outputs
        assert torch.equal(output, reference["expected"]), (output - reference["expected"]).abs().max()
        print("same")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "same" in result.stdout, result.stderr[-2000:]


def test_a_bad_bias_dtype_names_the_choices():
    with pytest.raises(ValueError, match=r"bias_dtype='bfloat16'.*\['model', 'float16'\]"):
        CompressionConfig(**{**CONFIG, "bias_dtype": "bfloat16"})
