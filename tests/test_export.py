import json

import pytest
import torch
from helpers import first_output, run_without_library, tiny_causal_lm, tiny_inputs, tiny_models
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, apply_compression
from hf_tensorcompress.core.export import shipped_files
from hf_tensorcompress.core.registry import get_method

CLASSES = [
    "PatchTSTForPrediction",
    "PatchTSTForClassification",
    "AutoformerForPrediction",
    "InformerForPrediction",
    "InformerForPrediction-full",
]


def _forward(name, model):
    torch.manual_seed(123)  # Informer's ProbSparse attention samples keys
    with torch.no_grad():
        return first_output(model(**tiny_inputs(name, model)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each class compressed (cp, and svd for one), saved, with its inputs and in-memory outputs."""
    root = tmp_path_factory.mktemp("saved")
    cases = [(name, "cp") for name in CLASSES] + [("PatchTSTForPrediction", "svd")]
    for name, method in cases:
        model = tiny_models()[name]
        options = {"cp_iterations": 20} if method == "cp" else {}
        apply_compression(model, CompressionConfig(method=method, rank=0.5, **options))
        folder = root / f"{name}-{method}"
        model.save_pretrained(folder)
        torch.save({"inputs": tiny_inputs(name, model), "output": _forward(name, model)}, folder / "io.pt")
    return root


def test_folder_holds_config_weights_and_self_contained_code(saved):
    folder = saved / "PatchTSTForPrediction-cp"
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_tensorcompress.CompressedPatchTSTForPrediction"
    assert config["compression_config"]["method"] == "cp" and len(config["compression_config"]["modules"]) == 6
    code = {f"{name}.py" for name in shipped_files([get_method("cp")]).values()}
    assert {*code, "model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert not {"tt_layer.py", "biprop_layer.py"} & {p.name for p in folder.iterdir()}  # only its method's files
    assert not {"lowbit_kernel.py", "torchao_linears.py"} & {p.name for p in folder.iterdir()}  # nor unused runtime
    for code in folder.glob("*.py"):
        imports = [line for line in code.read_text().splitlines() if line.strip().startswith(("import ", "from "))]
        assert not [line for line in imports if "hf_tensorcompress" in line or line.split()[1] in ("tensorly", "numpy")]


def test_loads_without_the_library_to_the_same_outputs(saved):
    script = f"""
    import torch, json, pathlib
    from transformers import AutoModel
    worst = {{}}
    for folder in sorted(pathlib.Path({str(saved)!r}).iterdir()):
        model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__name__.startswith("Compressed"), type(model)
        io = torch.load(folder / "io.pt")
        torch.manual_seed(123)
        with torch.no_grad():
            out = model(**io["inputs"])
        params = getattr(out, "params", None)
        if params is not None:
            value = torch.cat([p.flatten() for p in params])
        else:
            value = next(getattr(out, k) for k in ("prediction_outputs", "prediction_logits") if getattr(out, k, None) is not None)
        worst[folder.name] = float((value - io["output"]).abs().max())
    print(json.dumps(worst))
    """
    result = run_without_library(script, cwd=saved)
    worst = json.loads(result.stdout.strip().splitlines()[-1])
    # transformers would say it skips an unknown quantization and advise deleting quantization_config: untrue here
    assert "Unknown quantization type" not in result.stderr, result.stderr[-2000:]
    assert len(worst) == len(CLASSES) + 1
    assert all(diff <= 1e-5 for diff in worst.values()), worst


def test_loads_with_the_library_installed_too(saved):
    folder = saved / "AutoformerForPrediction-cp"
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    io = torch.load(folder / "io.pt")
    torch.testing.assert_close(_forward("AutoformerForPrediction", model), io["output"], atol=1e-5, rtol=1e-5)


def test_loaded_model_saves_again_with_its_code(saved, tmp_path):
    model = AutoModel.from_pretrained(saved / "PatchTSTForClassification-cp", trust_remote_code=True)
    model.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "cp_layer.py").exists()
    reloaded = AutoModel.from_pretrained(tmp_path / "again", trust_remote_code=True).eval()
    io = torch.load(saved / "PatchTSTForClassification-cp" / "io.pt")
    torch.testing.assert_close(_forward("PatchTSTForClassification", reloaded), io["output"], atol=1e-5, rtol=1e-5)


def test_checkpoint_whose_tensors_do_not_match_its_config_fails_clearly(saved, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    source = saved / "PatchTSTForPrediction-cp"
    for item in source.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    name = "model.encoder.layers.0.self_attn.q_proj"
    config["compression_config"]["modules"][name]["rank"] += 3  # config says one rank, tensors hold another
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not have the shapes its compression_config") as raised:
        AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert type(raised.value).__name__ == CompressedCheckpointError.__name__  # the remote code's own copy of it


def test_checkpoint_missing_compressed_tensors_fails_clearly(saved, tmp_path):
    folder = tmp_path / "missing"
    folder.mkdir()
    source = saved / "PatchTSTForPrediction-cp"
    for item in source.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.encoder.layers.1.self_attn.k_proj.factor_out"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing '\S*k_proj.factor_out'") as raised:
        AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert type(raised.value).__name__ == CompressedCheckpointError.__name__


#: Fields version 1 of the library wrote into every ``compression_config``, whatever the method (their defaults).
VERSION_1_FIELDS = {
    "target_modules": None,
    "rank": 0.5,
    "ranks": {},
    "init": "decompose",
    "cp_iterations": 100,
    "keep_ratio": 0.5,
    "weight_init": "kaiming_normal",
    "weight_seed": 0,
    "save_scores": False,
    "attention": None,
    "attention_keep_ratio": None,
    "attention_length": None,
    "attention_modules": [],
    "tt_shape": None,
    "tt_order": None,
    "tt_ranks": None,
    "tt_eps": None,
    "tt_basis": "identity",
    "tt_solver": "eigh",
    "tt_exact_tokens": 0,
    "tt_untie_output": False,
    "version": 1,
}


@pytest.mark.parametrize("method, options", [("cp", {"rank": 3}), ("biprop", {"attention": "qkv_mask"})])
def test_a_checkpoint_with_a_version_1_config_loads_unchanged(tmp_path, method, options):
    """A folder whose config.json holds the flat version-1 ``compression_config`` (every method's fields) loads
    to the same outputs through the library, and saves again as the method's own (version 2) config."""
    from hf_tensorcompress.loading import load_model

    model = apply_compression(tiny_models()["PatchTSTForPrediction"], CompressionConfig(method=method, **options))
    expected = _forward("PatchTSTForPrediction", model.eval())
    model.save_pretrained(tmp_path / "v1")
    config_file = tmp_path / "v1" / "config.json"
    config = json.loads(config_file.read_text())
    config["compression_config"] = {**VERSION_1_FIELDS, **config["compression_config"], "version": 1}
    config_file.write_text(json.dumps(config))
    loaded = load_model(tmp_path / "v1").eval()
    torch.testing.assert_close(_forward("PatchTSTForPrediction", loaded), expected)
    loaded.save_pretrained(tmp_path / "v2")
    saved_again = json.loads((tmp_path / "v2" / "config.json").read_text())["compression_config"]
    assert saved_again["version"] == 2 and "tt_basis" not in saved_again


def test_packed_storage_ships_the_kernel_and_remote_code_uses_it(tmp_path):
    """A checkpoint whose layers store packed codes carries the C kernels, and trust_remote_code copies and imports
    them; one without packed codes (checked above for cp) carries neither the kernels nor the torchao adapter."""
    model = tiny_causal_lm("llama")
    apply_compression(model, CompressionConfig(method="tiered", tier_tokens=[20], tier_bits=[4, 3], tier_group_size=8))
    model.save_pretrained(tmp_path / "tiered")
    assert (tmp_path / "tiered" / "lowbit_kernel.py").is_file()
    assert not (tmp_path / "tiered" / "torchao_linears.py").exists()
    result = run_without_library(
        f"""
        import sys
        from transformers import AutoModelForCausalLM
        import torch
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "tiered")!r}, trust_remote_code=True)
        model(torch.tensor([[1, 2, 3]]))
        print(sorted(name.rpartition(".")[2] for name in sys.modules if name.endswith((".lowbit_kernel", ".torchao_linears"))))
        """,
        tmp_path,
    )
    assert result.stdout.strip().splitlines()[-1] == "['lowbit_kernel']"
