"""decompress: every method back to a plain transformers model with the compressed model's outputs, saved as an
ordinary checkpoint that loads with neither the library nor remote code."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_without_library, tiny_causal_lm, tiny_patchtst_config
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, decompress

TIME_SERIES = {
    "cp": CompressionConfig(method="cp", rank=3, cp_iterations=5),
    "svd": CompressionConfig(method="svd", rank=4),
    "biprop": CompressionConfig(method="biprop", keep_ratio=0.5),
}


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def forecast(model, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(past_values=inputs).prediction_outputs


@pytest.mark.parametrize("method", sorted(TIME_SERIES))
def test_time_series_methods_decompress_to_the_same_outputs_and_a_plain_checkpoint(method, tmp_path):
    model = apply_compression(patchtst(), TIME_SERIES[method])
    inputs = torch.randn(2, 32, 3)
    expected = forecast(model, inputs)

    dense = decompress(model)

    assert type(dense) is PatchTSTForPrediction
    assert not any(type(m).__module__.startswith("hf_tensorcompress") for m in dense.modules())
    torch.testing.assert_close(forecast(dense, inputs), expected, atol=1e-5, rtol=1e-5)
    dense.save_pretrained(tmp_path / "dense")
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    assert not {"compression_config", "quantization_config", "auto_map"} & set(config)
    assert not list((tmp_path / "dense").glob("*.py"))
    torch.save(inputs, tmp_path / "inputs.pt")
    result = run_without_library(
        f"""
        import torch
        from transformers import AutoModel, PatchTSTForPrediction
        model = PatchTSTForPrediction.from_pretrained("{tmp_path / "dense"}").eval()
        with torch.no_grad():
            out = model(past_values=torch.load("{tmp_path / "inputs.pt"}")).prediction_outputs
        torch.save(out, "{tmp_path / "out.pt"}")
        print(type(AutoModel.from_pretrained("{tmp_path / "dense"}")).__name__)
    """,
        cwd=tmp_path,
    )
    assert result.stdout.strip().splitlines()[-1] == "PatchTSTModel"
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_tt_decompresses_to_a_tied_dense_model(family, tmp_path):
    model = tiny_causal_lm(family)
    model = apply_compression(model.eval(), CompressionConfig(method="tt", tt_shape=[2, 3, 4], tt_ranks=2))
    prompt = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        expected = model(prompt).logits
    tokens = model.generate(prompt, max_new_tokens=4, do_sample=False)

    dense = model.dequantize()  # transformers' name for the way back; decompress(model) is the same

    assert type(dense).__name__ == type(model).__name__ and type(dense).__module__.startswith("transformers.")
    assert dense.get_output_embeddings().weight is dense.get_input_embeddings().weight  # tied again
    assert dense.config.tie_word_embeddings
    with torch.no_grad():
        torch.testing.assert_close(dense(prompt).logits, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(dense.generate(prompt, max_new_tokens=4, do_sample=False), tokens)
    dense.save_pretrained(tmp_path / "dense")
    again = type(dense).from_pretrained(tmp_path / "dense").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(prompt).logits, expected, atol=1e-5, rtol=1e-5)


def test_biprop_attention_options_are_refused_before_anything_changes():
    model = apply_compression(patchtst(), CompressionConfig(method="biprop", keep_ratio=0.5, attention="step_t"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="attention='step_t'.*attention=None"):
        decompress(model)
    assert type(model).__name__ == "CompressedPatchTSTForPrediction"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_dense_model_is_refused():
    with pytest.raises(ValueError, match="not compressed"):
        decompress(patchtst())
