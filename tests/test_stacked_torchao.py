"""A compressed embedding beside torchao int8 Linears: apply, generate, save, load back (natively and without the
library), both orders, and the errors (``hf_tensorcompress.stacking``, ``runtime/torchao_linears.py``)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import run_without_library, tiny_causal_lm
from safetensors.torch import load_file
from torchao.quantization import IntxUnpackedToInt8Tensor, IntxWeightOnlyConfig
from torchao.quantization.granularity import PerAxis
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaForCausalLM, TorchAoConfig
from transformers.quantizers.auto import AutoHfQuantizer

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, apply_compression, quantize_linears
from hf_tensorcompress.core.extras import MissingExtraError

IDS = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(2))
GREEDY = dict(max_new_tokens=6, do_sample=False)
CONFIGS = {
    "tiered": CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8),
    "tt": CompressionConfig(method="tt", tt_order=3, tt_ranks=2),
}
LINEARS = [f"model.layers.{i}.{part}" for i in range(2) for part in ("self_attn.q_proj", "mlp.down_proj")]


def int8() -> TorchAoConfig:
    return TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))


def stacked(method: str = "tiered"):
    return quantize_linears(apply_compression(tiny_causal_lm("llama"), CONFIGS[method]), int8())


@pytest.mark.parametrize("method", ["tiered", "tt"])
def test_apply_generate_save_and_load_natively_give_equal_outputs(method, tmp_path):
    model = stacked(method)
    assert all(isinstance(model.get_submodule(name).weight, IntxUnpackedToInt8Tensor) for name in LINEARS)
    logits, generated = model(IDS).logits, model.generate(IDS[:1], **GREEDY)
    model.save_pretrained(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["compression_config"]["method"] == method
    marker = config["quantization_config"]
    assert marker["quant_method"] == "tensorcompress" and marker["version"] == 2
    assert marker["linears"]["quant_method"] == "torchao"
    assert marker["linears"]["quant_type"]["default"]["_type"] == "IntxWeightOnlyConfig"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert type(loaded).__name__ == "CompressedLlamaForCausalLM" and loaded.is_quantized
    assert type(loaded.get_input_embeddings()) is type(model.get_input_embeddings())
    assert all(isinstance(loaded.get_submodule(name).weight, IntxUnpackedToInt8Tensor) for name in LINEARS)
    assert torch.equal(loaded(IDS).logits, logits)
    assert torch.equal(loaded.generate(IDS[:1], **GREEDY), generated)
    loaded.save_pretrained(tmp_path / "b")  # the loaded model saves the same checkpoint again
    first, second = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert sorted(first) == sorted(second) and all(torch.equal(first[key], second[key]) for key in first)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["quantization_config"] == marker


def test_int8_linears_stay_close_to_the_float_ones():
    compressed = apply_compression(tiny_causal_lm("llama"), CONFIGS["tiered"])
    reference = compressed(IDS).logits
    logits = quantize_linears(compressed, int8())(IDS).logits
    assert 0 < (logits - reference).abs().max() < 0.05 * reference.abs().max()


@pytest.mark.parametrize("method", ["tiered", pytest.param("tt", marks=pytest.mark.slow)])  # a fresh Python: ~8 s
def test_loads_without_the_library_to_equal_outputs(method, tmp_path):
    model = stacked(method)
    model.save_pretrained(tmp_path / "stacked")
    torch.save({"logits": model(IDS).logits, "generated": model.generate(IDS[:1], **GREEDY)}, tmp_path / "io.pt")
    script = f"""
    import torch
    from transformers import AutoModelForCausalLM
    folder = {str(tmp_path / "stacked")!r}
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    io, ids = torch.load({str(tmp_path / "io.pt")!r}), torch.tensor({IDS.tolist()})
    assert type(model).__name__ == "CompressedLlamaForCausalLM", type(model)
    assert type(model.model.layers[0].mlp.up_proj.weight).__name__ == "IntxUnpackedToInt8Tensor"
    assert torch.equal(model(ids).logits, io["logits"])
    assert torch.equal(model.generate(ids[:1], max_new_tokens=6, do_sample=False), io["generated"])
    model.save_pretrained({str(tmp_path / "again")!r})
    print(model.config.quantization_config["linears"]["quant_method"])
    """
    assert run_without_library(script, cwd=tmp_path).stdout.split()[-1] == "torchao"
    first, again = (
        load_file(tmp_path / "stacked" / "model.safetensors"),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert sorted(first) == sorted(again) and all(torch.equal(first[key], again[key]) for key in first)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "again")(IDS).logits, model(IDS).logits)


def test_loading_with_torchao_then_compressing_gives_the_same_checkpoint(tmp_path):
    tiny_causal_lm("llama").save_pretrained(tmp_path / "dense")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=int8())
    reverse = apply_compression(loaded, CONFIGS["tiered"])
    reverse.save_pretrained(tmp_path / "reverse")
    stacked("tiered").save_pretrained(tmp_path / "forward")
    configs = [json.loads((tmp_path / name / "config.json").read_text()) for name in ("reverse", "forward")]
    assert configs[0]["quantization_config"] == configs[1]["quantization_config"]
    tensors = [load_file(tmp_path / name / "model.safetensors") for name in ("reverse", "forward")]
    assert sorted(tensors[0]) == sorted(tensors[1]) and all(
        torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0]
    )


def test_dequantize_gives_a_dense_float_model_with_close_outputs(tmp_path):
    model = stacked("tiered")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    expected = loaded(IDS).logits
    dense = loaded.dequantize()
    assert type(dense) is LlamaForCausalLM and not dense.is_quantized
    assert not hasattr(dense.config, "quantization_config")
    assert type(dense.model.layers[0].mlp.up_proj.weight) is torch.nn.Parameter
    torch.testing.assert_close(dense(IDS).logits, expected, atol=1e-5, rtol=1e-5)


def test_bad_inputs_name_the_fix(monkeypatch):
    compressed = apply_compression(tiny_causal_lm("llama"), CONFIGS["tiered"])
    with pytest.raises(TypeError, match="takes a transformers TorchAoConfig or a 4-bit BitsAndBytesConfig, got dict"):
        quantize_linears(compressed, {"quant_method": "torchao"})
    with pytest.raises(ValueError, match="is not compressed: quantize_linears quantizes the Linears beside"):
        quantize_linears(tiny_causal_lm("llama"), int8())
    quantize_linears(compressed, int8())
    with pytest.raises(ValueError, match="quantized already"):
        quantize_linears(compressed, int8())
    dense = tiny_causal_lm("llama")
    dense.hf_quantizer = AutoHfQuantizer.from_config(BitsAndBytesConfig(load_in_8bit=True))
    with pytest.raises(ValueError, match="quantized with 'bitsandbytes'; compressing it would drop"):
        apply_compression(dense, CONFIGS["tiered"])
    assert type(dense) is LlamaForCausalLM  # refused before anything changed
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(MissingExtraError, match=r"needs the optional package 'torchao'.*\.\[quant\]"):
        quantize_linears(apply_compression(tiny_causal_lm("llama"), CONFIGS["tiered"]), int8())


def test_a_checkpoint_needs_torchao_and_a_torchao_nested_config(tmp_path, monkeypatch):
    stacked("tiered").save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "torchao", None)
        with pytest.raises(ImportError, match=r"Linear weights are quantized with torchao.*pip install torchao"):
            AutoModelForCausalLM.from_pretrained(tmp_path)
    config["quantization_config"]["linears"]["quant_method"] = "gptq"
    config_file.write_text(json.dumps(config))
    with pytest.raises(CompressedCheckpointError, match="quant_method 'gptq'.*quantized with torchao"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_marker_newer_than_the_library_is_refused(tmp_path):
    stacked("tiered").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["version"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompressedCheckpointError, match=r"version.\] is 3, newer than this hf_tensorcompress reads"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
