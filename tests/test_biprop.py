"""Biprop sparse-binary layers, ``method="biprop"``, bit-packed checkpoints and the SBT attention options."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import (
    AutoformerConfig,
    AutoformerForPrediction,
    InformerConfig,
    InformerForPrediction,
    PatchTSTConfig,
    PatchTSTForClassification,
    PatchTSTForPrediction,
)

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.metrics import attention_multiply_adds, compression_report, nonzero_flops, storage_bits
from hf_tensorcompress.methods.biprop.attention import sbt_attention, sbt_multiply_adds, step_t_allowed
from hf_tensorcompress.methods.biprop.layer import BipropLinear, seeded_signs
from hf_tensorcompress.runtime.bit_packing import pack_bits, unpack_bits


def patchtst_classifier(**overrides) -> PatchTSTForClassification:
    torch.manual_seed(0)
    config = dict(
        num_input_channels=3,
        context_length=12,
        patch_length=1,
        patch_stride=1,
        d_model=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=64,
        num_targets=4,
    )
    return PatchTSTForClassification(PatchTSTConfig(**(config | overrides)))


# ---------------------------------------------------------------------- the layer
def test_layer_mask_alpha_and_effective_weight():
    layer = BipropLinear(16, 8, keep_ratio=0.25, sign_seed=3)
    mask = layer.mask()
    assert int(mask.sum()) == 32 and set(mask.unique().tolist()) == {0.0, 1.0}
    kept = layer.scores.detach().abs()[mask.bool()]
    assert kept.min() >= layer.scores.detach().abs()[~mask.bool()].max()  # top-k by |S|
    alpha = (layer.weight.abs() * mask).sum() / mask.sum()
    expected = alpha * torch.sign(layer.weight) * mask
    assert torch.allclose(layer.effective_weight(), expected)
    x = torch.randn(5, 16)
    assert torch.allclose(layer(x), x @ expected.T, atol=1e-6)


def test_straight_through_gradient_goes_to_scores_only():
    layer = BipropLinear(6, 4, keep_ratio=0.5, sign_seed=1).train()
    x = torch.randn(7, 6)
    upstream = torch.randn(7, 4)
    (layer(x) * upstream).sum().backward()
    grad_weff = upstream.T @ x  # dL/dW_eff
    expected = grad_weff * torch.sign(layer.weight) * layer.weight.abs() * torch.sign(layer.scores.detach())
    assert torch.allclose(layer.scores.grad, expected, atol=1e-5)
    assert [name for name, p in layer.named_parameters()] == ["scores"]  # W is a buffer: never trained
    assert not layer.weight.requires_grad


def test_folded_inference_matches_training_and_follows_score_updates():
    layer = BipropLinear(10, 10, keep_ratio=0.5, sign_seed=2)
    x = torch.randn(4, 10)
    train_out = layer.train()(x)
    eval_out = layer.eval()(x)
    assert torch.equal(train_out.detach(), eval_out)
    with torch.no_grad():
        layer.scores.mul_(torch.randn_like(layer.scores))  # a different mask
    assert torch.equal(layer(x), x @ layer.effective_weight().detach().T)


def test_signed_constant_init_and_bad_arguments():
    layer = BipropLinear(8, 4, weight_init="signed_constant", sign_seed=5)
    assert torch.allclose(layer.weight.abs(), torch.full_like(layer.weight, (2 / 8) ** 0.5))
    with pytest.raises(ValueError, match="fraction of weights kept"):
        BipropLinear(8, 4, keep_ratio=1.5)
    with pytest.raises(ValueError, match="weight_init"):
        BipropLinear(8, 4, weight_init="xavier")


def test_bit_packing_and_seeded_signs():
    bits = torch.rand(77) > 0.5
    packed = pack_bits(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == 10
    assert torch.equal(unpack_bits(packed, 77), bits)
    signs = seeded_signs(42, 4096)
    assert torch.equal(signs, seeded_signs(42, 4096)) and not torch.equal(signs, seeded_signs(43, 4096))
    assert set(signs.unique().tolist()) == {-1, 1} and abs(float(signs.float().mean())) < 0.1


# ---------------------------------------------------------------------- config and targets
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"keep_ratio": 0.0}, "fraction of weights"),
        ({"weight_init": "uniform"}, "weight_init"),
        ({"attention": "local"}, "attention"),
        ({"attention_length": 0}, "attention_length"),
    ],
)
def test_config_rejects_bad_biprop_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="biprop", **kwargs)
    with pytest.raises(ValueError, match="'attention' is an option of BipropConfig"):
        CompressionConfig(method="cp", attention="step_t")


def _tiny_informer():
    return InformerForPrediction(
        InformerConfig(
            prediction_length=4,
            context_length=8,
            input_size=1,
            lags_sequence=[1],
            num_time_features=1,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            attention_type="full",
        )
    )


def _tiny_autoformer():
    return AutoformerForPrediction(
        AutoformerConfig(
            prediction_length=4,
            context_length=8,
            input_size=1,
            lags_sequence=[1],
            num_time_features=1,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
        )
    )


@pytest.mark.parametrize("factory", [_tiny_informer, _tiny_autoformer, patchtst_classifier])
def test_default_targets_are_qkvo_and_all_linear_takes_the_encoder(factory):
    model = apply_compression(factory(), CompressionConfig(method="biprop"))
    names = list(model.config.compression_config["modules"])
    assert names and {n.rsplit(".", 1)[1] for n in names} == {"q_proj", "k_proj", "v_proj", "out_proj"}
    model = apply_compression(factory(), CompressionConfig(method="biprop", target_modules="all-linear"))
    names = list(model.config.compression_config["modules"])
    assert any("fc1" in n or "ff" in n for n in names) and all(".encoder." in f".{n}" for n in names)
    assert not any(isinstance(m, nn.Linear) for n, m in model.named_modules() if ".encoder." in f".{n}.")


def test_attention_option_refused_where_attention_is_not_interface_driven():
    model = _tiny_autoformer()
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(ValueError, match="AttentionInterface"):
        apply_compression(model, CompressionConfig(method="biprop", attention="step_t"))
    assert {n: type(m) for n, m in model.named_modules()} == before


# ---------------------------------------------------------------------- checkpoints
NO_LIBRARY_LOADER = textwrap.dedent(
    """
    import sys, torch
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "hf_tensorcompress":
                raise ImportError("hf_tensorcompress is blocked in this process")
    sys.meta_path.insert(0, Block())
    from transformers import AutoModel
    model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    inputs = torch.load(sys.argv[2])
    with torch.no_grad():
        out = model(**inputs)
    state = {k: v for k, v in model.state_dict().items() if "sbt_qkv_mask" in k}
    torch.save({"logits": out[0] if isinstance(out, tuple) else next(iter(out.values())), "masks": state}, sys.argv[3])
    """
)


def load_without_library(directory, inputs, tmp_path) -> dict:
    script, inputs_path, out_path = tmp_path / "load.py", tmp_path / "inputs.pt", tmp_path / "out.pt"
    script.write_text(NO_LIBRARY_LOADER)
    torch.save(inputs, inputs_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    subprocess.run(
        [sys.executable, str(script), str(directory), str(inputs_path), str(out_path)],
        check=True,
        env=env,
        cwd=tmp_path,
        capture_output=True,
    )
    return torch.load(out_path)


def test_checkpoint_holds_bits_is_small_and_loads_without_the_library(tmp_path):
    model = patchtst_classifier(d_model=64, num_attention_heads=4)
    model = apply_compression(model, CompressionConfig(method="biprop", keep_ratio=0.5, attention="qkv_mask"))
    with torch.no_grad():  # "train" the scores so the saved mask is not the initial one
        for layer in model.modules():
            if isinstance(layer, BipropLinear):
                layer.scores.copy_(torch.randn_like(layer.scores))
        first = model.model.encoder.layers[0].self_attn
        first.sbt_qkv_mask.copy_(torch.rand_like(first.sbt_qkv_mask, dtype=torch.float) > 0.5)
    model.eval()
    inputs = {"past_values": torch.randn(2, 12, 3)}
    with torch.no_grad():
        expected = model(**inputs).prediction_logits
    model.save_pretrained(tmp_path / "ckpt")
    biprop_bytes, dense_bytes = 0, 0
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as handle:
        for name, spec in model.config.compression_config["modules"].items():
            keys = sorted(k for k in handle.keys() if k.startswith(name + "."))
            assert keys == [name + ".alpha", name + ".mask_bits", name + ".weight"]  # .weight: the 1-byte tombstone
            assert handle.get_tensor(name + ".mask_bits").dtype == torch.uint8
            assert handle.get_tensor(name + ".weight").shape == ()
            biprop_bytes += sum(handle.get_tensor(k).numel() * handle.get_tensor(k).element_size() for k in keys)
            dense_bytes += 4 * (spec["in_features"] * spec["out_features"] + spec["out_features"])
    assert biprop_bytes * 25 <= dense_bytes
    loaded = load_without_library(tmp_path / "ckpt", inputs, tmp_path)
    assert (loaded["logits"] - expected).abs().max() <= 1e-6
    assert torch.equal(loaded["masks"]["model.encoder.layers.0.self_attn.sbt_qkv_mask"], first.sbt_qkv_mask)


def test_save_scores_keeps_training_state(tmp_path):
    from transformers import AutoModel

    model = apply_compression(patchtst_classifier(), CompressionConfig(method="biprop", save_scores=True))
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path, trust_remote_code=True)
    name = next(iter(model.config.compression_config["modules"]))
    original, restored = model.get_submodule(name), loaded.get_submodule(name)
    assert restored.trainable and torch.equal(restored.scores, original.scores)
    assert torch.equal(restored.weight, original.weight)
    x = torch.randn(2, 12, 3)
    assert torch.equal(model.eval()(past_values=x).prediction_logits, loaded.eval()(past_values=x).prediction_logits)


# ---------------------------------------------------------------------- attention options
def test_step_t_mask_exactly():
    allowed = step_t_allowed(5)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [0, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [1, 1, 1, 1, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    model = PatchTSTForPrediction(
        PatchTSTConfig(
            num_input_channels=2,
            context_length=6,
            patch_length=1,
            patch_stride=1,
            d_model=16,
            num_attention_heads=2,
            num_hidden_layers=1,
            ffn_dim=16,
            prediction_length=1,
        )
    )
    apply_compression(model, CompressionConfig(method="biprop", attention="step_t"))
    assert model.config._attn_implementation == "sbt_step_t"
    out = model.eval()(past_values=torch.randn(3, 6, 2), output_attentions=True)
    weights = out.attentions[0]  # (batch·channels, heads, 6, 6)
    assert torch.equal(weights > 0, step_t_allowed(6).expand_as(weights))
    assert torch.allclose(weights[..., :-1, :].sum(-1), torch.ones(1)) and torch.all(weights[..., -1, -1] == 0)


def test_qkv_masks_are_shared_by_heads_and_zero_activations():
    model = apply_compression(
        patchtst_classifier(), CompressionConfig(method="biprop", attention="qkv_mask", keep_ratio=0.25)
    )
    attention = model.model.encoder.layers[0].self_attn
    masks = attention.sbt_qkv_mask
    assert masks.shape == (3, 12, attention.head_dim) and "sbt_qkv_mask" in dict(attention.named_buffers())
    assert all(int(m.sum()) == round(0.25 * m.numel()) for m in masks)
    assert not torch.equal(masks[0], masks[1])
    query, key, value = (torch.randn(2, 4, 12, attention.head_dim) for _ in range(3))
    out, weights = sbt_attention(attention, query, key, value, None, scaling=0.5)
    q, k, v = (t * m for t, m in zip((query, key, value), masks.float()))  # same mask for every head
    reference = torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1)
    assert torch.allclose(weights, reference) and torch.allclose(out, (reference @ v).transpose(1, 2))


# ---------------------------------------------------------------------- metrics
def test_metrics_storage_and_nonzero_flops():
    dense = patchtst_classifier()
    inputs = {"past_values": torch.randn(2, 12, 3)}
    dense_flops = nonzero_flops(dense, **inputs)
    model = apply_compression(
        patchtst_classifier(), CompressionConfig(method="biprop", target_modules="all-linear", attention="step_t")
    )
    flops = nonzero_flops(model, **inputs)
    assert flops["linear"] < dense_flops["linear"] and flops["attention"] < dense_flops["attention"]
    # Table 5 per sequence (batch·channels = 6), 2 layers, h = 4, d' = 8, w = 12, 2 FLOPs per multiply-add:
    # canonical QKᵀ + AV = 2·h·d'·w², step-T = 3·h·(w−1)·d'
    assert dense_flops["attention"] == 2 * 2 * 6 * (2 * 4 * 8 * 12 * 12)
    assert flops["attention"] == 2 * 2 * 6 * (3 * 4 * 11 * 8)
    report = compression_report(model, tokens=1)
    row = next(r for r in report["modules"] if r["name"].endswith("q_proj"))
    assert row["bits"] == 32 * 32 + 32 and row["dense_bits"] == 32 * (32 * 32 + 32)
    assert row["params"] == 32 * 32 // 2 + 1 and row["flops"] == 32 * 32
    assert storage_bits(model) < storage_bits(dense)
    half = SimpleNamespace(head_dim=8, num_heads=2, sbt_attention="qkv_mask", sbt_qkv_mask=torch.tensor([1, 0] * 8))
    assert sbt_multiply_adds(half, 10) == {"qk": 2 * 8 * 25, "av": 2 * 8 * 50}
    assert attention_multiply_adds(10, 8, 2) == {"qk": 2 * 8 * 100, "av": 2 * 8 * 100}


def test_informer_step_t_on_the_encoder_only_and_decoder_stays_causal():
    model = _tiny_informer().eval()
    apply_compression(model, CompressionConfig(method="biprop", attention="step_t"))
    assert model.config.compression_config["attention_modules"] == ["model.encoder.layers.0.self_attn"]
    batch, length, horizon = 2, 9, 4
    with torch.no_grad():
        out = model(
            past_values=torch.randn(batch, length),
            past_time_features=torch.randn(batch, length, 1),
            past_observed_mask=torch.ones(batch, length),
            future_values=torch.randn(batch, horizon),
            future_time_features=torch.randn(batch, horizon, 1),
            output_attentions=True,
        )
    encoder = out.encoder_attentions[0]
    assert torch.equal(encoder > 0, step_t_allowed(encoder.shape[-1]).expand_as(encoder))
    decoder = out.decoder_attentions[0]
    assert torch.equal(decoder > 0, torch.ones(horizon, horizon, dtype=torch.bool).tril().expand_as(decoder))


def test_step_t_is_reinstalled_when_a_checkpoint_loads(tmp_path):
    from transformers import AutoModel

    model = PatchTSTForPrediction(
        PatchTSTConfig(
            num_input_channels=2,
            context_length=6,
            patch_length=1,
            patch_stride=1,
            d_model=16,
            num_attention_heads=2,
            num_hidden_layers=1,
            ffn_dim=16,
            prediction_length=1,
        )
    )
    apply_compression(model, CompressionConfig(method="biprop", attention="step_t"))
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert loaded.config._attn_implementation == "sbt_step_t"
    out = loaded(past_values=torch.randn(2, 6, 2), output_attentions=True).attentions[0]
    assert torch.equal(out > 0, step_t_allowed(6).expand_as(out))
