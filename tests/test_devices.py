"""The method contract on every device and dtype at hand: apply, forward against the float32 reference, save/load,
and generate, with every tensor staying on the model's device and in its dtype.

The CUDA half is marked ``gpu`` and skips, with its reason, where no CUDA device is visible (CI is CPU-only);
``pytest -m gpu`` runs it on a GPU machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressedLayer, CompressionConfig, apply_compression

CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")]
    ),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: Largest difference from the float32 reference, relative to the reference's scale, per dtype.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 6e-2, torch.float16: 1e-2}

TIME_SERIES = {
    "cp": CompressionConfig(method="cp", rank=3, cp_iterations=5),
    "svd": CompressionConfig(method="svd", rank=4),
    "biprop": CompressionConfig(method="biprop", keep_ratio=0.5, attention="qkv_mask"),
}


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def tensors_on(model: torch.nn.Module, device: str, dtype: torch.dtype) -> list[str]:
    """Parameters and compressed layers' buffers of ``model`` that are not on ``device`` (floating ones: not in
    ``dtype``). Other buffers are transformers' own choice (rotary frequencies stay float32 on purpose)."""
    buffers = [
        (f"{name}.{key}", buffer)
        for name, module in model.named_modules()
        if isinstance(module, CompressedLayer)
        for key, buffer in module.named_buffers()
    ]
    wrong = []
    for name, tensor in [*model.named_parameters(), *buffers]:
        if tensor.device.type != device or (tensor.is_floating_point() and tensor.dtype != dtype):
            wrong.append(f"{name}: {tensor.device} {tensor.dtype}")
    return wrong


def close(actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> float:
    return float((actual.float().cpu() - reference).abs().max() / reference.abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", sorted(TIME_SERIES))
def test_time_series_methods_on_each_device_and_dtype(method, dtype, device, tmp_path):
    reference = apply_compression(patchtst(), TIME_SERIES[method])
    inputs = torch.randn(2, 32, 3)
    with torch.no_grad():
        expected = reference(past_values=inputs).prediction_outputs

    model = copy.deepcopy(reference).to(device=device, dtype=dtype)
    assert not tensors_on(model, device, dtype)
    with torch.no_grad():
        output = model(past_values=inputs.to(device, dtype)).prediction_outputs
    assert output.device.type == device and output.dtype == dtype
    assert close(output, expected, dtype) < TOLERANCE[dtype]

    model.save_pretrained(tmp_path)
    loaded = type(reference).from_pretrained(tmp_path, dtype=dtype).to(device).eval()
    assert not tensors_on(loaded, device, dtype)
    with torch.no_grad():
        again = loaded(past_values=inputs.to(device, dtype)).prediction_outputs
    torch.testing.assert_close(again, output)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tt_compresses_and_generates_on_each_device_and_dtype(dtype, device, tmp_path):
    config = CompressionConfig(method="tt", tt_shape=[2, 3, 4], tt_ranks=2)
    reference = apply_compression(tiny_causal_lm("llama"), config)
    prompt = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        expected = reference(prompt).logits

    model = apply_compression(
        tiny_causal_lm("llama").to(device=device, dtype=dtype), config
    )  # the decomposition runs there too
    assert not tensors_on(model, device, dtype)
    with torch.no_grad():
        logits = model(prompt.to(device)).logits
    assert logits.device.type == device and close(logits, expected, dtype) < 10 * TOLERANCE[dtype]
    tokens = model.generate(prompt.to(device), max_new_tokens=4, do_sample=False)
    assert tokens.device.type == device and tokens.shape == (1, 9)

    model.save_pretrained(tmp_path)
    loaded = type(reference).from_pretrained(tmp_path, dtype=dtype).to(device).eval()
    assert not tensors_on(loaded, device, dtype)
    assert torch.equal(loaded.generate(prompt.to(device), max_new_tokens=4, do_sample=False), tokens)
