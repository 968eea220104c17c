"""Loading as strict as safetensors: each tampered checkpoint of issue 30's finding 4 is refused with
CompressedCheckpointError naming the file and the key, natively and through trust_remote_code, where it used to load
silently wrong or crash the process at the first generate (``tests/test_checkpoint_mutation.py`` fuzzes the rest)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import run_without_library
from safetensors import safe_open
from safetensors.torch import save_file
from test_checkpoint_mutation import tiny_lm
from torchao.quantization import IntxWeightOnlyConfig
from torchao.quantization.granularity import PerAxis
from transformers import AutoModelForCausalLM, TorchAoConfig

from hf_tensorcompress import CompressedCheckpointError, CompressionConfig, apply_compression, quantize_linears

EMBED = "model.embed_tokens"
TIERED = CompressionConfig(method="tiered", tier_tokens=[64], tier_bits=[8, 3], tier_group_size=32, low_rank=4)
IDS = torch.tensor([[5, 9, 70, 200]])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("strict")
    apply_compression(tiny_lm(), TIERED).save_pretrained(root / "tiered")
    int8 = TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))
    quantize_linears(apply_compression(tiny_lm(), TIERED), int8).save_pretrained(root / "stacked")
    rank8 = CompressionConfig(method="tiered", tier_tokens=[64], tier_bits=[8, 4], tier_group_size=32, low_rank=8)
    apply_compression(tiny_lm(), rank8).save_pretrained(root / "tiered_rank8")  # int8 and bf16 factors: one shape
    return root


def tampered(
    saved: Path,
    name: str,
    target: Path,
    tensors: Callable[[dict], None] | None = None,
    config: Callable[[dict], None] | None = None,
) -> Path:
    folder = target / name
    shutil.copytree(saved / name, folder)
    if tensors is not None:
        with safe_open(folder / "model.safetensors", framework="pt") as handle:
            metadata, values = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}
        tensors(values)
        save_file(values, folder / "model.safetensors", metadata=metadata)
    if config is not None:
        values = json.loads((folder / "config.json").read_text())
        config(values)
        (folder / "config.json").write_text(json.dumps(values))
    return folder


def set_tensor(key: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        tensors[key] = change(tensors[key])

    return edit


def set_spec(field: str, value) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        config["compression_config"]["modules"][EMBED][field] = value

    return edit


def duplicate(slot: torch.Tensor) -> torch.Tensor:
    slot = slot.clone()
    slot[1] = slot[0]
    return slot


def out_of_range(slot: torch.Tensor) -> torch.Tensor:
    slot = slot.clone()
    slot[3] = 256
    return slot


def last_tier_bits_zero(config: dict) -> None:
    config["compression_config"]["modules"][EMBED]["tiers"][-1]["bits"] = 0


TIERED_CASES = {
    "scale stored as uint8 (generate segfaulted)": (
        dict(tensors=set_tensor(f"{EMBED}.tiers.1.scale", lambda t: t.to(torch.uint8))),
        rf"'{EMBED}.tiers.1.scale' is stored as torch.uint8, where this layer stores torch.float16",
    ),
    "codes stored wider (logits off by ~1)": (
        dict(tensors=set_tensor(f"{EMBED}.tiers.0.codes", lambda t: t.to(torch.int16))),
        rf"'{EMBED}.tiers.0.codes' is stored as torch.int16, where this layer stores torch.uint8",
    ),
    "minimum stored as int8 (NaN)": (
        dict(tensors=set_tensor(f"{EMBED}.tiers.0.minimum", lambda t: t.to(torch.int8))),
        rf"'{EMBED}.tiers.0.minimum' is stored as torch.int8",
    ),
    "a duplicate in the slot map": (
        dict(tensors=set_tensor(f"{EMBED}.slot", duplicate)),
        rf"'{EMBED}.slot' maps 2 tokens to row \d+: it must be a permutation",
    ),
    "a slot out of range (IndexError at the first forward)": (
        dict(tensors=set_tensor(f"{EMBED}.slot", out_of_range)),
        rf"'{EMBED}.slot' maps token 3 to row 256, outside 0..255",
    ),
    "a tier's bits edited to 0 (zero rows)": (
        dict(config=last_tier_bits_zero),
        rf"the tensors of '{EMBED}' do not match its spec in config.json .*extra '{EMBED}.tiers.1.codes'",
    ),
    "rank edited to 0": (
        dict(config=set_spec("rank", 0)),
        rf"extra '{EMBED}.left.codes'",
    ),
    "rank_bits edited from 8 to 16 (garbage rows)": (
        dict(config=set_spec("rank_bits", 16)),
        rf"the tensors of '{EMBED}' do not match its spec.*extra '{EMBED}.left.(minimum|scale)'",
        "tiered_rank8",
    ),
    "tied_output edited to null (a random lm_head)": (
        dict(config=set_spec("tied_output", None)),
        r"holds no weight for the output layer 'lm_head' \('lm_head.weight' is missing\).*tied_output",
    ),
}
QPROJ = "model.layers.0.self_attn.q_proj"
STACKED_CASES = {
    "the linears entry removed (random Linears)": (
        dict(config=lambda config: config["quantization_config"].pop("linears")),
        r"is part of a torchao-quantized Linear weight, but config.json's quantization_config has no 'linears'",
    ),
    "a quantized tensor removed": (
        dict(tensors=lambda tensors: tensors.pop(f"{QPROJ}._weight_qdata")),
        rf"the torchao-quantized weight '{QPROJ}.weight' lacks \['{QPROJ}._weight_qdata'\]",
    ),
    "a NaN torchao scale": (
        dict(tensors=set_tensor(f"{QPROJ}._weight_scale", lambda t: t.index_fill(0, torch.tensor([0]), float("nan")))),
        rf"'{QPROJ}._weight_scale' holds NaN or infinite values",
    ),
}


@pytest.mark.parametrize("case", list(TIERED_CASES))
def test_a_tampered_tiered_checkpoint_is_refused_natively(saved, tmp_path, case):
    edits, message, *name = TIERED_CASES[case]
    folder = tampered(saved, name[0] if name else "tiered", tmp_path, **edits)
    with pytest.raises(CompressedCheckpointError, match=message) as raised:
        AutoModelForCausalLM.from_pretrained(folder)
    assert "model.safetensors" in str(raised.value) or "config.json" in str(raised.value)


@pytest.mark.parametrize("case", list(STACKED_CASES))
def test_a_tampered_stacked_checkpoint_is_refused_natively(saved, tmp_path, case):
    edits, message = STACKED_CASES[case]
    folder = tampered(saved, "stacked", tmp_path, **edits)
    with pytest.raises(CompressedCheckpointError, match=message):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
def test_the_same_checkpoints_are_refused_without_the_library(saved, tmp_path):
    """One child process without hf_tensorcompress loads every tampered folder with trust_remote_code."""
    cases = {f"tiered: {k}": ((v[2:] or ("tiered",))[0], *v[:2]) for k, v in TIERED_CASES.items()}
    cases.update({f"stacked: {k}": ("stacked", *v) for k, v in STACKED_CASES.items()})
    folders = {}
    for index, (case, (name, edits, message)) in enumerate(cases.items()):
        target = tmp_path / str(index)
        target.mkdir()
        folders[case] = (str(tampered(saved, name, target, **edits)), message)
    script = f"""
    import re
    from transformers import AutoModelForCausalLM
    for case, (folder, message) in {folders!r}.items():
        try:
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
            print("LOADED", case)
        except Exception as error:
            refused = type(error).__name__ == "CompressedCheckpointError" and re.search(message, str(error))
            print("REFUSED" if refused else "OTHER", case, type(error).__name__, str(error)[:300])
    """
    lines = run_without_library(script, cwd=tmp_path).stdout.splitlines()
    assert sum(line.startswith("REFUSED") for line in lines) == len(cases), "\n".join(lines)


def test_the_untouched_checkpoints_load_and_generate(saved):
    for name in ("tiered", "stacked"):
        model = AutoModelForCausalLM.from_pretrained(saved / name)
        assert model.generate(IDS, max_new_tokens=3, do_sample=False).shape == (1, 7)


def test_one_load_path_checks_each_layer_once(tmp_path, monkeypatch):
    """The library's ``Compressed<Base>.from_pretrained`` leaves the checks to the quantizer transformers runs for it:
    every layer's state is checked once, whichever class loads the checkpoint."""
    from helpers import tiny_time_series
    from transformers import PatchTSTForPrediction

    from hf_tensorcompress import CompressionConfig, apply_compression
    from hf_tensorcompress.methods.svd.layer import LowRankLinear
    from hf_tensorcompress.saving import library_class

    model = apply_compression(tiny_time_series("patchtst"), CompressionConfig(method="svd", rank=2))
    model.save_pretrained(tmp_path)
    checked = []
    original = LowRankLinear.check_state
    monkeypatch.setattr(LowRankLinear, "check_state", lambda self: checked.append(self) or original(self))
    layers = len(model.config.compression_config["modules"])
    for loader in (PatchTSTForPrediction, library_class(PatchTSTForPrediction)):
        checked.clear()
        loader.from_pretrained(tmp_path)
        assert len(checked) == layers, loader
