"""``hf-tensorcompress compress --quantize-linears``: the Linears a method leaves uncompressed quantized by torchao
(int8) or packed by bitsandbytes (NF4), saved beside the compressed layers and loaded back in a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import save_word_level_lm
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression, quantize_linears
from hf_tensorcompress.cli import main
from hf_tensorcompress.cli.checkpoint_size import weight_bytes

TIERED = ["--method", "tiered", "--tier-tokens", "16", "--tier-bits", "8", "4", "--tier-group-size", "16"]
IDS = torch.tensor([[1, 5, 9, 33, 2, 60]])


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> Path:
    return save_word_level_lm(tmp_path_factory.mktemp("lm"), 64, 64)


def compress(capsys, source: Path, output: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["compress", str(source), str(output), *TIERED, *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_bnb_nf4_round_trips_through_a_new_process(lm_folder, tmp_path, capsys):
    output = tmp_path / "nf4"
    code, out, _ = compress(capsys, lm_folder, output, "--quantize-linears", "bnb-nf4", "--dtype", "bfloat16")
    assert code == 0 and "Linears bnb-nf4, the rest in bfloat16" in out and "size on disk:" in out
    linears = json.loads((output / "config.json").read_text())["quantization_config"]["linears"]
    assert linears["quant_method"] == "bitsandbytes" and linears["bnb_4bit_quant_type"] == "nf4"
    config = CompressionConfig(method="tiered", tier_tokens=[16], tier_bits=[8, 4], tier_group_size=16)
    expected = apply_compression(LlamaForCausalLM.from_pretrained(lm_folder), config)
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    expected = quantize_linears(expected, nf4).to(torch.bfloat16)  # what the command does, in this process
    stored = load_file(output / "model.safetensors")
    for key, value in expected.state_dict().items():
        assert torch.equal(stored[key], value), key  # packed codes, quant states, the rest in bf16
    torch.save(AutoModelForCausalLM.from_pretrained(output)(IDS).logits, tmp_path / "logits.pt")
    script = f"""
    import torch
    import hf_tensorcompress  # noqa: F401
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({str(output)!r})
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert model.model.norm.weight.dtype == torch.bfloat16
    assert torch.equal(model(torch.tensor({IDS.tolist()})).logits, torch.load({str(tmp_path / "logits.pt")!r}))
    print("identical")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split()[-1] == "identical"


def test_each_choice_stores_fewer_bytes_and_records_its_quantizer(lm_folder, tmp_path, capsys):
    sizes = {}
    for choice, method in (("none", None), ("torchao-int8", "torchao"), ("bnb-nf4", "bitsandbytes")):
        output = tmp_path / choice
        code, _, _ = compress(capsys, lm_folder, output, "--quantize-linears", choice, "--dtype", "float32")
        assert code == 0
        marker = json.loads((output / "config.json").read_text())["quantization_config"]
        assert marker.get("linears", {}).get("quant_method") == method
        sizes[choice] = weight_bytes(output)
    assert sizes["bnb-nf4"] < sizes["torchao-int8"] < sizes["none"]


def test_a_bad_value_is_a_usage_error_naming_the_choices(lm_folder, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(lm_folder), str(tmp_path / "o"), *TIERED, "--quantize-linears", "int4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--quantize-linears: invalid choice: 'int4'" in err and "bnb-nf4" in err and "torchao-int8" in err
    assert not (tmp_path / "o").exists()
