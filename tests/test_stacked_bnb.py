"""A compressed embedding beside bitsandbytes 4-bit (NF4) Linears: packed on CPU, saved as one checkpoint, loaded back
in a new process natively and without the library, dequantized, strictly checked, and the errors
(``hf_tensorcompress.stacking``, ``runtime/bnb_linears.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from bitsandbytes.nn import Linear4bit
from helpers import run_without_library, tiny_causal_lm
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaForCausalLM

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, apply_compression, quantize_linears

IDS = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(2))
TIERED = CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8)
LINEARS = [f"model.layers.{i}.{part}" for i in range(2) for part in ("self_attn.q_proj", "mlp.down_proj")]
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def nf4(double_quant: bool = True) -> BitsAndBytesConfig:
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant)


def stacked(double_quant: bool = True):
    return quantize_linears(apply_compression(tiny_causal_lm("llama"), TIERED), nf4(double_quant))


def test_linears_are_packed_two_codes_a_byte_and_stay_close():
    compressed = apply_compression(tiny_causal_lm("llama"), TIERED)
    reference = compressed(IDS).logits
    model = quantize_linears(compressed, nf4())
    assert all(type(model.get_submodule(name)) is Linear4bit for name in LINEARS)
    assert type(model.get_input_embeddings()).__name__ == "TieredEmbedding"  # the compressed layer is left alone
    weight = model.get_submodule("model.layers.0.mlp.down_proj").weight
    assert weight.dtype == torch.uint8 and weight.numel() == 24 * 32 // 2
    logits = model(IDS).logits
    assert 0 < (logits - reference).abs().max() < 0.2 * reference.abs().max()


def test_save_then_load_in_a_new_process_gives_identical_logits(tmp_path):
    model = stacked()
    model.save_pretrained(tmp_path / "a")
    marker = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert marker["quant_method"] == "tensorcompress" and marker["version"] == 2
    assert marker["linears"]["quant_method"] == "bitsandbytes" and marker["linears"]["bnb_4bit_quant_type"] == "nf4"
    stored = load_file(tmp_path / "a" / "model.safetensors")
    assert stored[Q_PROJ].dtype == torch.uint8 and stored[Q_PROJ].numel() == 24 * 24 // 2
    torch.save(model(IDS).logits, tmp_path / "logits.pt")
    script = f"""
    import torch
    import hf_tensorcompress  # noqa: F401  (registers the library's quantizer)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "a")!r})
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit", type(model.model.layers[0].mlp.up_proj)
    assert torch.equal(model(torch.tensor({IDS.tolist()})).logits, torch.load({str(tmp_path / "logits.pt")!r}))
    model.save_pretrained({str(tmp_path / "b")!r})
    print("identical")
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split()[-1] == "identical"
    again = load_file(tmp_path / "b" / "model.safetensors")
    assert sorted(again) == sorted(stored) and all(torch.equal(again[key], stored[key]) for key in stored)


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_loads_without_the_library_and_names_bitsandbytes_where_it_is_missing(tmp_path):
    model = stacked()
    model.save_pretrained(tmp_path / "stacked")
    torch.save(model(IDS).logits, tmp_path / "logits.pt")
    script = f"""
    import torch
    from transformers import AutoModelForCausalLM
    folder = {str(tmp_path / "stacked")!r}
    sys.modules["bitsandbytes"] = None  # as on a machine without it
    try:
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    except ImportError as error:
        assert "pip install bitsandbytes" in str(error), error
    else:
        raise AssertionError("loaded without bitsandbytes")
    del sys.modules["bitsandbytes"]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == "CompressedLlamaForCausalLM", type(model)
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert torch.equal(model(torch.tensor({IDS.tolist()})).logits, torch.load({str(tmp_path / "logits.pt")!r}))
    print(model.config.quantization_config["linears"]["quant_method"])
    """
    assert run_without_library(script, cwd=tmp_path).stdout.split()[-1] == "bitsandbytes"


@pytest.mark.parametrize("double_quant", [True, False])
def test_dequantize_gives_the_dense_model_with_the_same_outputs(double_quant, tmp_path):
    model = stacked(double_quant)
    expected = model(IDS).logits
    model.save_pretrained(tmp_path)
    dense = AutoModelForCausalLM.from_pretrained(tmp_path).dequantize()
    assert type(dense) is LlamaForCausalLM and not dense.is_quantized
    assert type(dense.model.layers[0].mlp.up_proj) is torch.nn.Linear
    torch.testing.assert_close(dense(IDS).logits, expected, atol=1e-5, rtol=1e-5)


def _edit(folder, change) -> None:
    """Rewrite ``model.safetensors`` with ``change(tensors)`` applied."""
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop(Q_PROJ + ".absmax"), r"lacks 'model.layers.0.self_attn.q_proj.weight.absmax'"),
        (lambda t: t.update({Q_PROJ: t[Q_PROJ][:-1]}), r"q_proj.weight' is torch.uint8 of shape \[287, 1\]"),
        (
            lambda t: t.update({Q_PROJ + ".nested_absmax": t[Q_PROJ + ".nested_absmax"].double()}),
            r"nested_absmax' is torch.float64 .* where bitsandbytes stores torch.float32",
        ),
        (
            lambda t: t.update({Q_PROJ + ".quant_state.bitsandbytes__nf4": torch.tensor([1, 2], dtype=torch.uint8)}),
            r"is not a bitsandbytes quant state",
        ),
        (
            lambda t: t.update(
                {Q_PROJ + ".nested_absmax": torch.full_like(t[Q_PROJ + ".nested_absmax"], float("nan"))}
            ),
            r"holds NaN or infinite values \(a 4-bit Linear's quant state\)",
        ),
    ],
)
def test_strict_loading_names_the_broken_part(change, message, tmp_path):
    stacked().save_pretrained(tmp_path)
    _edit(tmp_path, change)
    with pytest.raises(CompressedCheckpointError, match=message):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_packed_parts_without_their_config_are_refused(tmp_path):
    stacked().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "tensorcompress", "version": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompressedCheckpointError, match="no bitsandbytes 'linears' entry saying how to read it"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_bad_inputs_name_the_fix(tmp_path, monkeypatch):
    compressed = apply_compression(tiny_causal_lm("llama"), TIERED)
    with pytest.raises(ValueError, match="bitsandbytes 4-bit only: BitsAndBytesConfig\\(load_in_4bit=True"):
        quantize_linears(compressed, BitsAndBytesConfig(load_in_8bit=True))
    quantize_linears(compressed, nf4())
    with pytest.raises(ValueError, match="quantized already"):
        quantize_linears(compressed, nf4())
    compressed.save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ImportError, match=r"4-bit bitsandbytes weights.*pip install bitsandbytes"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_every_missing_package_of_4bit_linears_is_named_at_once(monkeypatch):
    """A bare environment was told to install bitsandbytes, then, once it had, accelerate."""
    import importlib.util

    from hf_tensorcompress.runtime import bnb_linears

    present = importlib.util.find_spec
    monkeypatch.setattr(
        bnb_linears.importlib.util, "find_spec", lambda name: None if name in bnb_linears.PACKAGES else present(name)
    )
    with pytest.raises(
        ImportError, match="need bitsandbytes and accelerate, not installed here: pip install bitsandbytes accelerate"
    ):
        bnb_linears.bitsandbytes_module()
