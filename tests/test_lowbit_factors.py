"""CP and SVD factors stored as low-bit codes: trained rounded, saved packed, loaded back (natively and through
``trust_remote_code`` without the library) to the same outputs, and counted in bytes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import safe_open
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.methods.cp.layer import CPLinear
from hf_tensorcompress.methods.svd.layer import LowRankLinear
from hf_tensorcompress.runtime.factor_storage import rounded, stored
from tests.helpers import run_without_library, tiny_patchtst_config

ALL_LINEAR = r".*(q_proj|k_proj|v_proj|out_proj|ff\.[03]|projection)"


def quantized_patchtst(bits: int | str, group_size: int | None = None, method: str = "svd") -> PatchTSTForPrediction:
    """Every Linear as SVD, or the q/k/v projections as CP, with ``bits``-bit factors."""
    torch.manual_seed(0)
    model = PatchTSTForPrediction(tiny_patchtst_config())
    config = CompressionConfig(
        method=method,
        target_modules=ALL_LINEAR if method == "svd" else None,
        rank=0.5,
        factor_bits=bits,
        factor_group_size=group_size,
    )
    return apply_compression(model, config).eval()


@pytest.mark.parametrize(
    "method,bits,group_size",
    [("svd", 8, None), ("svd", 4, 8), ("cp", 8, None), ("cp", 4, 2), ("svd", 16, None), ("cp", "ternary", 2)],
)
def test_saved_codes_load_natively_to_the_same_outputs_and_stay_packed(tmp_path, method, bits, group_size):
    model = quantized_patchtst(bits, group_size, method)
    x = torch.randn(2, 32, 3)
    with torch.no_grad():
        expected = model(past_values=x).prediction_outputs
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        keys = list(handle.keys())
    assert not any(".factor_" in key for key in keys)  # codes only, no fp32 factors
    assert any(key.endswith("stored_out.codes") for key in keys)
    loaded = PatchTSTForPrediction.from_pretrained(tmp_path).eval()
    layers = [m for m in loaded.modules() if isinstance(m, (LowRankLinear, CPLinear))]
    assert layers and all(layer.stored and not hasattr(layer, "factor_out") for layer in layers)
    code_type = torch.bfloat16 if bits == 16 else torch.uint8  # 16: bfloat16 values, no scales
    assert all(layer.stored_out.codes.dtype == code_type for layer in layers)
    with torch.no_grad():  # the trained model multiplies float factors, the loaded one its codes (fused kernel):
        torch.testing.assert_close(loaded(past_values=x).prediction_outputs, expected, rtol=1e-5, atol=1e-6)
    counted, before = compression_report(loaded)["bytes"]["targets"], compression_report(model)["bytes"]["targets"]
    assert counted["disk"] == counted["ram"] == before["disk"] < 0.3 * counted["dense"]  # packed in RAM too
    assert linear_bytes(loaded)["ram"] < linear_bytes(model)["ram"]


#: case -> (method, factor width, group size) of the checkpoints loaded in a new process (the fast tier's: SVD, whose
#: models build in a second; the CP decomposition takes longer)
NEW_PROCESS_CASES = {"svd-16": ("svd", 16, 8), "svd-ternary": ("svd", "ternary", 8)}
REMOTE_CODE_CASES = NEW_PROCESS_CASES | {"svd-4": ("svd", 4, None), "cp-4": ("cp", 4, None)}
REMOTE_CODE_CASES |= {"cp-ternary": ("cp", "ternary", None), "cp-16": ("cp", 16, None)}


def save_cases(folder, cases: dict[str, tuple]) -> None:
    """Every model of ``cases`` saved under ``folder/<case>``, with their input and outputs in ``io.pt``."""
    x = torch.randn(2, 32, 3)
    expected = {}
    for case, (method, bits, group_size) in cases.items():
        model = quantized_patchtst(bits, group_size, method)
        with torch.no_grad():
            expected[case] = model(past_values=x).prediction_outputs
        model.save_pretrained(folder / case)
    torch.save({"x": x, "expected": expected}, folder / "io.pt")


def test_16_bit_and_ternary_factors_load_in_a_new_process_to_the_same_outputs(tmp_path):
    save_cases(tmp_path, NEW_PROCESS_CASES)
    check = f"""
        import torch
        from hf_tensorcompress import load_model
        io = torch.load("io.pt")
        for case in {sorted(NEW_PROCESS_CASES)!r}:
            model = load_model(case).eval()
            layers = [m for m in model.modules() if getattr(m, "stored", False)]
            assert layers, case
            with torch.no_grad():
                out = model(past_values=io["x"]).prediction_outputs
            torch.testing.assert_close(out, io["expected"][case], rtol=1e-5, atol=1e-6)
        print("ok")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(check)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_trust_remote_code_without_the_library_gives_the_same_outputs(tmp_path):
    save_cases(tmp_path, REMOTE_CODE_CASES)
    run_without_library(
        f"""
        import os, torch
        os.environ["HF_MODULES_CACHE"] = {str(tmp_path / "modules")!r}
        from transformers import AutoModel
        io = torch.load({str(tmp_path / "io.pt")!r})
        for case in {sorted(REMOTE_CODE_CASES)!r}:
            model = AutoModel.from_pretrained(os.path.join({str(tmp_path)!r}, case), trust_remote_code=True).eval()
            assert "hf_tensorcompress" not in type(model).__module__
            with torch.no_grad():
                out = model(past_values=io["x"]).prediction_outputs
            torch.testing.assert_close(out, io["expected"][case], rtol=1e-5, atol=1e-6)  # up to summation order
        """,
        tmp_path,
    )


@pytest.mark.parametrize("method,bits", [("svd", 8), ("cp", 8), ("svd", 16), ("svd", "ternary")])
def test_training_rounds_like_storage_and_the_best_weights_reload(method, bits):
    model = quantized_patchtst(bits, None, method)
    layer = next(m for m in model.modules() if isinstance(m, (LowRankLinear, CPLinear)))
    layer.train()
    x = torch.randn(3, layer.in_features)
    layer(x).sum().backward()
    assert layer.factor_out.grad is not None and layer.factor_out.grad.abs().sum() > 0
    layer.eval()
    kept = {k: v.clone() for k, v in model.state_dict().items()}  # what BestValidation keeps
    with torch.no_grad():
        before = layer(x)
        layer.factor_out.add_(1.0)
    model.load_state_dict(kept)
    with torch.no_grad():
        assert torch.equal(layer(x), before)


@pytest.mark.parametrize("group_size", [None, 8])
def test_ternary_factors_store_three_levels_per_group_exactly_and_round_idempotently(group_size):
    torch.manual_seed(0)
    matrix = torch.randn(6, 16)
    kept = stored(matrix, "ternary", group_size)
    values = kept.dequantize()
    assert kept.codes.shape == (6, 4) and kept.scale.shape == (6, 16 // (group_size or 16))  # five codes a byte
    assert torch.equal(rounded(matrix, "ternary", group_size), values)  # training computes with what is stored
    group = group_size or 16
    grouped = matrix.reshape(6, -1, group)
    codes = (grouped / grouped.abs().mean(dim=-1, keepdim=True)).round().clamp(-1, 1)  # BitNet b1.58's codes
    level = (grouped.abs() * (codes != 0)).sum(-1) / (codes != 0).sum(-1)  # least squares for those codes
    assert torch.equal(values.reshape(6, -1, group), codes * level.half().float()[..., None])
    assert torch.equal(rounded(values, "ternary", group_size), values)  # a reloaded checkpoint rounds to itself
    levels = values.reshape(-1, group)
    assert all(len(row.unique()) <= 3 for row in levels) and max(len(row.unique()) for row in levels) == 3
    leaf = matrix.clone().requires_grad_()
    rounded(leaf, "ternary", group_size).sum().backward()  # straight-through
    assert torch.equal(leaf.grad, torch.ones_like(matrix))
    assert torch.equal(rounded(matrix, 16, group_size), matrix.bfloat16().float())  # 16: bfloat16 values


def test_post_training_switch_and_bad_settings():
    torch.manual_seed(0)
    layer = LowRankLinear(32, 16, 8)
    x = torch.randn(4, 32)
    exact = layer(x)
    layer.set_factor_bits(8)
    # U (16×8) and Vᵀ (8×32): one byte per code, an fp16 scale and minimum per row; the fp32 bias
    assert layer.storage_bits() == (16 * 8 + 16 * 4 + 8 * 32 + 8 * 4) * 8 + 16 * 32
    assert torch.allclose(layer(x), exact, atol=0.05) and not torch.equal(layer(x), exact)
    layer.set_factor_bits("ternary")  # five codes a byte (2 bytes a row of U, 7 of Vᵀ) and an fp16 level per row
    assert layer.storage_bits() == (16 * 2 + 16 * 2 + 8 * 7 + 8 * 2) * 8 + 16 * 32
    layer.set_factor_bits(16)  # two bytes a value, no scales
    assert layer.storage_bits() == (16 * 8 * 2 + 8 * 32 * 2) * 8 + 16 * 32
    with pytest.raises(ValueError, match="factor_bits=5.*16, 8, 4, 3, 2, 'ternary'"):
        CompressionConfig(method="svd", factor_bits=5)
    with pytest.raises(ValueError, match="factor_bits='binary'"):
        CompressionConfig(method="cp", factor_bits="binary")
    config = CompressionConfig(method="svd", factor_bits="ternary", factor_group_size=32)
    assert CompressionConfig.from_json_string(config.to_json_string()) == config
    with pytest.raises(ValueError, match="factor_group_size"):
        CompressionConfig(method="cp", factor_bits=4, factor_group_size=0)
    with pytest.raises(ValueError, match="pass factor_bits"):
        LowRankLinear(4, 4, 2, stored=True)
