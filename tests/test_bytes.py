"""Bytes of every Linear weight, on disk and in RAM, for dense, compressed, torchao-quantized and ternary layers;
the quantization baselines; the bytes-vs-metric front; the ``report`` command's bytes table."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report
from hf_tensorcompress.baselines import quantization
from hf_tensorcompress.cli import main as cli_main
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.evaluation.pareto import arm_points, budget_rows, front
from tests.helpers import tiny_patchtst_config

QKV = ["model.encoder.layers.0.self_attn.q_proj", "model.encoder.layers.0.self_attn.k_proj"]


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def test_dense_counts_fp32_and_svd_its_factors():
    model = patchtst()
    dense = linear_bytes(model)
    weights = sum(m.weight.numel() + m.bias.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert dense["disk"] == dense["ram"] == dense["dense"] == weights * 4 and dense["disk_ratio"] == 1.0
    apply_compression(model, CompressionConfig(method="svd", target_modules=QKV, rank=4))
    counted = linear_bytes(model)["modules"][QKV[0]]
    assert counted["disk"] == counted["ram"] == (4 * (32 + 32) + 32) * 4 and counted["dense"] == (32 * 32 + 32) * 4


@pytest.mark.parametrize("scheme,bits,group", [("int8", 8, 32), ("int4", 4, 32), ("int2", 2, 32)])
def test_ptq_packs_codes_on_disk_and_keeps_int8_in_ram(scheme, bits, group):
    model = patchtst()
    x, h = torch.randn(2, 32, 3), torch.randn(4, 32)
    layer = model.get_submodule(QKV[0])
    with torch.no_grad():
        before, layer_before = model(past_values=x).prediction_outputs, layer(h)
    quantization.quantize_linears(model, QKV, scheme)
    row = linear_bytes(model)["modules"][QKV[0]]
    groups = 32 * (32 // group if group < 32 else 1)  # 32 inputs: one group per row (a group must be smaller)
    assert row["disk"] == 32 * 32 * bits // 8 + groups * 5 + 32 * 4  # codes, fp32 scale + int8 zero point, bias
    assert row["ram"] == 32 * 32 + groups * 5 + 32 * 4
    with torch.no_grad():  # the rounded weights act (the tiny random model's output barely depends on q and k)
        after, layer_after = model(past_values=x).prediction_outputs, model.get_submodule(QKV[0])(h)
    assert not torch.equal(layer_after, layer_before) and torch.allclose(layer_after, layer_before, atol=0.5)
    assert torch.allclose(after, before, atol=0.5)


def test_ternary_qat_weights_take_three_values_and_gradients_reach_the_latent_weights():
    model = patchtst().train()
    quantization.ternary_training(model, QKV)
    layer = model.get_submodule(QKV[0])
    scale = layer.parametrizations.weight.original.abs().mean()
    assert set((layer.weight / scale).round().unique().tolist()) <= {-1.0, 0.0, 1.0}
    model(past_values=torch.randn(2, 32, 3), future_values=torch.randn(2, 8, 3)).loss.backward()
    assert layer.parametrizations.weight.original.grad.abs().sum() > 0
    assert quantization.ternary_bytes(32, 32) == 32 * 7 + 4  # five codes a byte, per row
    with pytest.raises(TypeError, match="nn.Linear"):
        quantization.ternary_training(model, ["model.encoder.layers.0.self_attn"])
    with pytest.raises(ValueError, match="int3"):
        quantization.ptq_config("int3", 32)


def test_pareto_front_and_budgets():
    runs = [
        {"name": n, "metrics": {"mse": m}, "linear_bytes": {"disk_ratio": b}}
        for n, m, b in [
            ("dense", 1.0, 1.0),
            ("ptq-int8-all", 1.0, 0.26),
            ("ptq-int2-all", 1.4, 0.1),
            ("svd-x", 0.9, 0.12),
            ("svd-y", 2.0, 0.05),
        ]
    ]
    points = arm_points(runs, "mse")
    assert [p["name"] for p in front(points, True)] == ["svd-y", "ptq-int2-all", "svd-x"]
    rows = {round(1 / r["budget"]): r for r in budget_rows(points, True)}
    assert rows[8]["library"]["name"] == "svd-x" and rows[8]["baseline"]["name"] == "ptq-int2-all"
    assert rows[8]["library_at_least_as_good"] is True and rows[4]["library_at_least_as_good"] is True
    assert rows[16]["baseline"] is None and rows[16]["library_at_least_as_good"] is None


def test_report_has_bytes_of_the_targets_and_every_linear(tmp_path, capsys):
    model = apply_compression(patchtst(), CompressionConfig(method="svd", target_modules=QKV, rank=4, factor_bits=8))
    report = compression_report(model)["bytes"]
    assert report["targets"]["disk"] < report["targets"]["dense"] / 4
    assert report["linear"]["dense"] == linear_bytes(patchtst())["dense"]
    model.save_pretrained(tmp_path)
    assert cli_main(["report", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "every Linear layer" in printed and "compressed modules" in printed
