"""Loading compressed checkpoints natively (the registered ``tensorcompress`` quantizer) and compress-on-load:
refusals, broken checkpoints, dtype and device_map, the quantizer's flags. The method × family matrix is in
test_contract.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM, LlamaForCausalLM, PatchTSTForPrediction
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, TensorCompressQuantizer, apply_compression
from hf_tensorcompress.runtime.contract import QUANT_METHOD

X = torch.randn(2, 32, 3, generator=torch.Generator().manual_seed(1))
IDS = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(2))


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A dense PatchTST, its cp compression (saved), a biprop one with scores, and a TT Llama (saved)."""
    root = tmp_path_factory.mktemp("native")
    patchtst().save_pretrained(root / "dense")
    model = apply_compression(patchtst(), CompressionConfig(method="cp", rank=0.5, cp_iterations=2))
    model.save_pretrained(root / "cp")
    apply_compression(patchtst(), CompressionConfig(method="biprop", save_scores=True)).save_pretrained(root / "scores")
    lm = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    lm.save_pretrained(root / "tt")
    return root


def copy_of(folder, target):
    shutil.copytree(folder, target)
    return target


def test_importing_the_library_registers_the_quant_method():
    assert AUTO_QUANTIZER_MAPPING[QUANT_METHOD] is TensorCompressQuantizer
    assert AUTO_QUANTIZATION_CONFIG_MAPPING[QUANT_METHOD].__name__ == "CompressedCheckpointConfig"
    quantizer = TensorCompressQuantizer(CompressionConfig(method="cp"), pre_quantized=False)
    assert quantizer.is_trainable and quantizer.is_qat_trainable and quantizer.is_serializable()


def test_without_the_quantizer_a_plain_class_refuses_instead_of_loading_random_weights(folders, monkeypatch):
    """What a process without hf_tensorcompress sees, in this process: transformers skips the unknown quant_method,
    and the tombstones turn the load into a size-mismatch error (also for biprop's kept scores)."""
    monkeypatch.delitem(AUTO_QUANTIZER_MAPPING, QUANT_METHOD)
    monkeypatch.delitem(AUTO_QUANTIZATION_CONFIG_MAPPING, QUANT_METHOD)
    for folder, cls in (("cp", PatchTSTForPrediction), ("scores", PatchTSTForPrediction), ("tt", LlamaForCausalLM)):
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            cls.from_pretrained(folders / folder)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModel.from_pretrained(folders / "cp")


def test_the_one_load_that_cannot_refuse_is_an_explicit_ignore_mismatched_sizes(folders, monkeypatch):
    """Without the library, ``ignore_mismatched_sizes=True`` asks transformers to drop every mismatched tensor and
    initialise the module instead: no checkpoint content can overrule that flag. The load report lists each replaced
    module's weight as mismatched (that is all a plain class can do)."""
    monkeypatch.delitem(AUTO_QUANTIZER_MAPPING, QUANT_METHOD)
    monkeypatch.delitem(AUTO_QUANTIZATION_CONFIG_MAPPING, QUANT_METHOD)
    model, info = PatchTSTForPrediction.from_pretrained(
        folders / "cp", ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert type(model) is PatchTSTForPrediction
    mismatched = {key for key, *_ in info["mismatched_keys"]}
    assert mismatched == {
        f"{name}.weight"
        for name in json.loads((folders / "cp" / "config.json").read_text())["compression_config"]["modules"]
    }


def test_biprop_scores_checkpoint_keeps_the_frozen_weight_off_the_dense_key(folders):
    tensors = load_file(folders / "scores" / "model.safetensors")
    name = "model.encoder.layers.0.self_attn.q_proj"
    assert tensors[f"{name}.weight"].shape == () and tensors[f"{name}.frozen_weight"].shape == (32, 32)
    loaded = PatchTSTForPrediction.from_pretrained(folders / "scores")
    layer = loaded.get_submodule(name)
    assert layer.trainable and torch.equal(layer.frozen_weight, tensors[f"{name}.frozen_weight"])


def test_a_loaded_model_is_an_ordinary_model(folders):
    model = PatchTSTForPrediction.from_pretrained(folders / "cp")
    assert getattr(model, "hf_quantizer", None) is None and not model.is_quantized
    assert not hasattr(model.config, "_is_quantized")
    assert model.config.quantization_config == {"quant_method": QUANT_METHOD, "version": 1}
    assert model.half().dtype == torch.float16  # transformers refuses .half() on quantized models


def test_missing_compressed_tensor_is_refused_natively(folders, tmp_path):
    folder = copy_of(folders / "cp", tmp_path / "missing")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.encoder.layers.1.self_attn.k_proj.factor_out"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CompressedCheckpointError, match="k_proj.factor_out"):
        PatchTSTForPrediction.from_pretrained(folder)


def test_tensors_that_do_not_match_the_specs_are_refused_natively(folders, tmp_path):
    folder = copy_of(folders / "cp", tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    config["compression_config"]["modules"]["model.encoder.layers.0.self_attn.q_proj"]["rank"] += 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CompressedCheckpointError,
        match=r"model.safetensors: model.encoder.layers.0.self_attn.q_proj"
        r".factor_\w+ has shape .*config.json compression_config\['modules'\]",
    ):
        PatchTSTForPrediction.from_pretrained(folder)


@pytest.mark.parametrize("drop", ["compression_config", "modules"])
def test_config_without_compression_config_is_a_clear_error(folders, tmp_path, drop):
    folder = copy_of(folders / "cp", tmp_path / "no-specs")
    config = json.loads((folder / "config.json").read_text())
    if drop == "modules":
        del config["compression_config"]["modules"]
    else:
        del config["compression_config"]
    (folder / "config.json").write_text(json.dumps(config))
    for load in (
        PatchTSTForPrediction.from_pretrained,
        AutoModel.from_pretrained,
        lambda path: AutoModel.from_pretrained(path, trust_remote_code=True),
    ):
        with pytest.raises(ValueError, match="no compression_config with the module specs") as raised:
            load(folder)
        assert type(raised.value).__name__ == "CompressedCheckpointError"


def test_compress_on_load_refuses_what_needs_calibration_data(folders, tmp_path):
    dense_lm = tmp_path / "dense-lm"
    tiny_causal_lm("llama").save_pretrained(dense_lm)
    for options in (dict(tt_basis="output"), dict(tt_exact_tokens=4)):
        with pytest.raises(ValueError, match="cannot carry calibration data.*apply_tt"):
            LlamaForCausalLM.from_pretrained(
                dense_lm, quantization_config=CompressionConfig(method="tt", tt_ranks=2, **options)
            )


def test_compress_on_load_checks_targets_before_reading_weights(folders):
    with pytest.raises(ValueError, match="matches no module"):
        PatchTSTForPrediction.from_pretrained(
            folders / "dense", quantization_config=CompressionConfig(method="cp", target_modules=["nope"])
        )


def test_compressing_an_already_compressed_checkpoint_on_load_is_refused(folders):
    with pytest.raises(ValueError, match="quantized with CompressedCheckpointConfig"):
        PatchTSTForPrediction.from_pretrained(folders / "cp", quantization_config=CompressionConfig(method="svd"))


@pytest.mark.parametrize("device_map", [None, "cpu", "auto"])
def test_dtype_and_device_map(folders, device_map):
    reference = PatchTSTForPrediction.from_pretrained(folders / "cp")(past_values=X).prediction_outputs
    model = PatchTSTForPrediction.from_pretrained(folders / "cp", dtype=torch.bfloat16, device_map=device_map)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.device.type == "cpu"
    torch.testing.assert_close(
        model(past_values=X.bfloat16()).prediction_outputs.float(), reference, atol=0.1, rtol=0.1
    )
    lm = AutoModelForCausalLM.from_pretrained(folders / "tt", dtype=torch.bfloat16, device_map=device_map)
    embedding = lm.get_input_embeddings()
    assert embedding.cores[0].dtype == torch.bfloat16 and embedding.token_ranks.dtype == torch.int32
    assert lm(IDS).logits.dtype == torch.bfloat16
    on_load = PatchTSTForPrediction.from_pretrained(
        folders / "dense",
        quantization_config=CompressionConfig(method="svd"),
        dtype=torch.bfloat16,
        device_map=device_map,
    )
    assert {p.dtype for p in on_load.parameters()} == {torch.bfloat16}


def test_torch_load_state_dict_reads_a_checkpoint_with_its_tombstones(folders):
    """What the Trainer does when it resumes: ``model.load_state_dict`` of the saved file, strictly."""
    model = PatchTSTForPrediction.from_pretrained(folders / "cp")
    fresh = apply_compression(patchtst(), CompressionConfig(method="cp", rank=0.5, cp_iterations=1))
    fresh.load_state_dict(load_file(folders / "cp" / "model.safetensors"), strict=True)
    assert torch.equal(fresh(past_values=X).prediction_outputs, model(past_values=X).prediction_outputs)


@pytest.mark.parametrize(
    "config",
    [
        CompressionConfig(method="tiered", tier_tokens=[40], tier_bits=[8, 4], tier_group_size=8),
        CompressionConfig(method="tt", tt_order=3, tt_ranks=2, tt_storage_bits=8),
    ],
    ids=["tiered", "tt-storage-bits"],
)
def test_the_base_model_class_keeps_the_loaded_embedding(config, tmp_path):
    """AutoModel (the base class) asks its ``_init_weights`` about every module; a loaded compressed layer is left
    as loaded, so its hidden states equal those of the task class's base model."""
    apply_compression(tiny_causal_lm("llama"), config).save_pretrained(tmp_path / "lm")
    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "lm").model(IDS).last_hidden_state
    assert torch.equal(AutoModel.from_pretrained(tmp_path / "lm")(IDS).last_hidden_state, expected)


def test_a_new_process_loads_natively_after_importing_the_library(folders):
    """An inference script imports the library and loads: the method's modules are imported for the first time
    inside transformers' meta-device context (nothing may compute a tensor value at import)."""
    script = (
        "import sys, torch, hf_tensorcompress\n"
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print('loaded', type(model).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(folders / "tt")], capture_output=True, text=True, cwd=folders, timeout=300
    )
    assert result.returncode == 0 and "loaded CompressedLlamaForCausalLM" in result.stdout, result.stderr[-3000:]
