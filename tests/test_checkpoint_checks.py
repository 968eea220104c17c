"""A tampered checkpoint is refused at load with the library's error naming the file and the key, through every
load path (the base class, load_model, trust_remote_code); where the library is absent the load report names the fix."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers import run_without_library, tiny_causal_lm, tiny_patchtst_config
from safetensors.torch import load_file, save_file
from transformers import AutoModel, LlamaForCausalLM, PatchTSTForPrediction

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, apply_compression
from hf_tensorcompress.loading import load_model
from hf_tensorcompress.runtime.contract import SIGNPOST_KEY, SIGNPOST_KEYS

Q_PROJ = "model.encoder.layers.0.self_attn.q_proj"
LOADS = {
    "base class": lambda folder, base: base.from_pretrained(folder),
    "load_model": lambda folder, base: load_model(folder),
    "trust_remote_code": lambda folder, base: AutoModel.from_pretrained(folder, trust_remote_code=True),
}


@contextmanager
def refused(pattern: str) -> Iterator[None]:
    """The library's CompressedCheckpointError matching ``pattern``: this package's class, or the same class of the
    copy of the shipped code that trust_remote_code loads."""
    with pytest.raises(ValueError, match=pattern) as raised:
        yield
    assert type(raised.value).__name__ == CompressedCheckpointError.__name__


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("checks")
    apply_compression(patchtst(), CompressionConfig(method="cp", rank=2, cp_iterations=2)).save_pretrained(root / "cp")
    apply_compression(patchtst(), CompressionConfig(method="biprop")).save_pretrained(root / "biprop")
    lm = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    lm.save_pretrained(root / "tt")
    return root


def edited(folders, name, tmp_path, edit_config=None, edit_tensors=None):
    folder = tmp_path / name
    shutil.copytree(folders / name, folder)
    if edit_config:
        config = json.loads((folder / "config.json").read_text())
        edit_config(config["compression_config"])
        (folder / "config.json").write_text(json.dumps(config))
    if edit_tensors:
        tensors = load_file(folder / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("load", list(LOADS))
def test_a_nan_in_a_factor_is_refused_naming_file_and_key(folders, tmp_path, load):
    def poison(tensors):
        tensors[f"{Q_PROJ}.factor_out"][0, 0] = float("nan")

    folder = edited(folders, "cp", tmp_path, edit_tensors=poison)
    with refused(rf"model.safetensors: tensor '{Q_PROJ}.factor_out' holds NaN"):
        LOADS[load](folder, PatchTSTForPrediction)


def test_a_nan_in_a_tt_core_is_refused(folders, tmp_path):
    key = next(k for k in load_file(folders / "tt" / "model.safetensors") if "embed_tokens.core" in k)

    def poison(tensors):
        tensors[key].view(-1)[0] = float("inf")

    folder = edited(folders, "tt", tmp_path, edit_tensors=poison)
    with refused(rf"model.safetensors: tensor '{key}' holds NaN or infinite"):
        LlamaForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("load", ["base class", "load_model"])
def test_an_unknown_method_name_is_refused(folders, tmp_path, load):
    folder = edited(folders, "cp", tmp_path, edit_config=lambda c: c.update(method="cpp"))
    with refused(r"config.json: compression_config\['method'\] = 'cpp'.*'cp'"):
        LOADS[load](folder, PatchTSTForPrediction)


@pytest.mark.parametrize("load", list(LOADS))
def test_an_edited_rank_names_the_file_the_key_and_the_spec(folders, tmp_path, load):
    def edit(compression):
        compression["modules"][Q_PROJ]["rank"] += 3

    folder = edited(folders, "cp", tmp_path, edit_config=edit)
    with refused(
        rf"model.safetensors: {Q_PROJ}.factor_\w+ has shape "
        rf".*compression_config\['modules'\]\['{Q_PROJ}'\]"
    ):
        LOADS[load](folder, PatchTSTForPrediction)


@pytest.mark.parametrize("load", list(LOADS))
def test_a_spec_with_a_missing_field_names_the_module(folders, tmp_path, load):
    folder = edited(folders, "cp", tmp_path, edit_config=lambda c: c["modules"][Q_PROJ].pop("rank"))
    with refused(rf"compression_config\['modules'\]\['{Q_PROJ}'\] is not a valid"):
        LOADS[load](folder, PatchTSTForPrediction)


@pytest.mark.parametrize("load", list(LOADS))
def test_an_edited_biprop_sign_seed_is_refused(folders, tmp_path, load):
    def edit(compression):
        compression["modules"][Q_PROJ]["sign_seed"] += 1

    folder = edited(folders, "biprop", tmp_path, edit_config=edit)
    with refused(rf"\['{Q_PROJ}'\].*sign_seed=\d+ regenerates signs"):
        LOADS[load](folder, PatchTSTForPrediction)


def test_the_untouched_checkpoints_load(folders):
    for name, base in (("cp", PatchTSTForPrediction), ("biprop", PatchTSTForPrediction), ("tt", LlamaForCausalLM)):
        for load in LOADS.values():
            assert type(load(folders / name, base)).__name__.startswith("Compressed")


@pytest.mark.parametrize("load", list(LOADS))
def test_a_checkpoint_with_an_earlier_signpost_loads(folders, tmp_path, load):
    """Checkpoints of earlier versions hold the signpost they wrote; the library's classes ignore it too."""

    def edit(tensors):
        tensors[SIGNPOST_KEYS[1]] = tensors.pop(SIGNPOST_KEY)

    folder = edited(folders, "cp", tmp_path, edit_tensors=edit)
    model = LOADS[load](folder, PatchTSTForPrediction)
    model.load_state_dict(load_file(folder / "model.safetensors"), strict=True)  # torch's path (a Trainer resuming)


def test_without_the_library_the_load_report_names_the_fix(folders):
    """transformers' own error text is fixed ("You set `ignore_mismatched_sizes` to `False`…"); the load report
    printed above it lists the checkpoint's keys, and the signpost key there says what to do."""
    result = run_without_library(
        f"""
        from transformers import PatchTSTForPrediction
        try:
            PatchTSTForPrediction.from_pretrained({str(folders / "cp")!r})
        except RuntimeError as error:
            print("refused:", error)
        """,
        cwd=folders,
    )
    assert "refused:" in result.stdout
    assert SIGNPOST_KEY in result.stderr and "trust_remote_code=True" in SIGNPOST_KEY
    assert "import hf_tensorcompress first" in SIGNPOST_KEY  # installed but not imported: the same report


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded") / "cp"
    model = apply_compression(patchtst(), CompressionConfig(method="cp", rank=2, cp_iterations=2))
    model.save_pretrained(folder, max_shard_size="20KB")
    return folder


def unreadable_shard(sharded, tmp_path, how: str):
    """A copy of ``sharded`` whose index names its first shard outside the folder, or where a FIFO replaced it."""
    root = tmp_path / "root"
    folder = root / "cp"
    shutil.copytree(sharded, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    if how == "fifo":
        (folder / first).unlink()
        os.mkfifo(folder / first)
        return folder
    (folder / first).rename(root / first)
    outside = f"../{first}" if how == "parent" else str(root / first)
    index["weight_map"] = {key: outside if name == first else name for key, name in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("how", ["parent", "absolute"])
@pytest.mark.parametrize("load", list(LOADS))
def test_a_shard_outside_the_folder_is_refused(sharded, tmp_path, load, how):
    """transformers before 5.25 follows an index's ``../`` and absolute shard names, and the library refuses them;
    from 5.25 transformers refuses them itself, before the library's check runs."""
    folder = unreadable_shard(sharded, tmp_path, how)
    ours = r"model.safetensors.index.json names the shard .*a path outside the checkpoint's folder"
    theirs = r"has a shard filename that points outside the model directory"
    with pytest.raises(ValueError, match=f"{ours}|{theirs}") as raised:
        LOADS[load](folder, PatchTSTForPrediction)
    if not re.search(theirs, str(raised.value)):
        assert type(raised.value).__name__ == CompressedCheckpointError.__name__


FIFO_LOADS = """
import json, sys
from transformers import AutoModel, PatchTSTForPrediction
from hf_tensorcompress.loading import load_model
found = {}
for name, load in (("base class", PatchTSTForPrediction.from_pretrained), ("load_model", load_model),
                   ("trust_remote_code", lambda folder: AutoModel.from_pretrained(folder, trust_remote_code=True))):
    try:
        load(sys.argv[1])
        found[name] = "loaded"
    except ValueError as error:
        found[name] = type(error).__name__ + ": " + str(error)
print(json.dumps(found))
"""


def test_a_fifo_shard_is_refused_not_read_forever(sharded, tmp_path):
    """The library's own header check opened a FIFO and waited forever (in a child process: a hang is a failure)."""
    folder = unreadable_shard(sharded, tmp_path, "fifo")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", FIFO_LOADS, str(folder)], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for load, outcome in json.loads(run.stdout.strip().splitlines()[-1]).items():
        assert outcome.startswith("CompressedCheckpointError") and "not a regular file" in outcome, (load, outcome)


def test_the_sharded_checkpoint_loads(sharded):
    for load in LOADS.values():
        assert type(load(sharded, PatchTSTForPrediction)).__name__ == "CompressedPatchTSTForPrediction"


#: Each edited ``quantization_config["version"]``: a string and null raised a raw TypeError; a future version loaded
#: where the library is not installed.
VERSIONS = {"text": ("1", "not a version this library writes"), "null": (None, "not a version this library writes"),
            "future": (7, "newer than this hf_tensorcompress reads")}  # fmt: skip


def with_version(folders, tmp_path, version) -> str:
    folder = tmp_path / f"version-{version}"
    shutil.copytree(folders / "cp", folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["version"] = version
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("edit", list(VERSIONS))
@pytest.mark.parametrize("load", list(LOADS))
def test_an_edited_marker_version_is_refused_naming_it(folders, tmp_path, load, edit):
    version, pattern = VERSIONS[edit]
    with refused(rf"quantization_config\['version'\] is .*{pattern}"):
        LOADS[load](with_version(folders, tmp_path, version), PatchTSTForPrediction)


def test_an_edited_marker_version_is_refused_where_the_library_is_not_installed(folders, tmp_path):
    edits = {edit: str(with_version(folders, tmp_path, version)) for edit, (version, _) in VERSIONS.items()}
    result = run_without_library(
        f"""
        import json
        from transformers import AutoModel
        found = {{}}
        for edit, folder in {edits!r}.items():
            try:
                AutoModel.from_pretrained(folder, trust_remote_code=True)
                found[edit] = "loaded"
            except ValueError as error:
                found[edit] = type(error).__name__ + ": " + str(error)
        print(json.dumps(found))
        """,
        cwd=tmp_path,
    )
    found = json.loads(result.stdout.strip().splitlines()[-1])
    for edit, (_, pattern) in VERSIONS.items():
        assert found[edit].startswith("CompressedCheckpointError") and pattern in found[edit], found[edit]
