"""Biprop's inference-only form holds packed bits in RAM and computes what the folded weight computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import PatchTSTConfig, PatchTSTForClassification

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.metrics import resident_bytes
from hf_tensorcompress.methods.biprop import layer as biprop_layer
from hf_tensorcompress.methods.biprop.layer import BipropLinear


@pytest.mark.parametrize("shape", [(16, 24), (37, 13), (5, 3), (300, 9)])
def test_packed_forward_equals_the_folded_weight(shape, monkeypatch):
    layer = BipropLinear(*shape, keep_ratio=0.3, sign_seed=7, trainable=False)
    x = torch.randn(4, 5, shape[0])
    folded = F.linear(x, layer.folded_weight())
    assert torch.equal(layer(x), folded)  # one block: the same weight values, the same matmul
    monkeypatch.setattr(biprop_layer, "BLOCK_WEIGHTS", 64)  # several blocks, a ragged last one
    assert torch.allclose(layer(x), folded, rtol=1e-6, atol=1e-6)


def test_loaded_model_keeps_two_bits_per_weight_in_ram(tmp_path):
    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=3,
        context_length=12,
        patch_length=1,
        patch_stride=1,
        d_model=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=128,
        num_targets=4,
    )
    trained = apply_compression(
        PatchTSTForClassification(config),
        CompressionConfig(method="biprop", target_modules="all-linear", keep_ratio=0.5),
    ).eval()
    x = torch.randn(2, 12, 3)
    with torch.no_grad():
        expected = trained(past_values=x).prediction_logits  # the trainable form's folded path
    trained.save_pretrained(tmp_path)
    loaded = PatchTSTForClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(past_values=x).prediction_logits, expected)
    layers = [m for m in loaded.modules() if isinstance(m, BipropLinear)]
    assert layers and all(not layer.trainable for layer in layers)
    for layer in layers:
        dense_fp32 = layer.in_features * layer.out_features * 4
        assert resident_bytes(layer) <= dense_fp32 / 8, f"{layer} holds {resident_bytes(layer)} bytes"
        assert layer._cache is None and not layer._signs  # no folded float copy, no int8 signs


def test_training_form_still_trains_and_folds():
    layer = BipropLinear(8, 6, keep_ratio=0.5, sign_seed=1).train()
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.scores.grad is not None
    layer.eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.allclose(layer(x), F.linear(x, layer.effective_weight()))
