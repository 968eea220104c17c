"""The contract every method keeps on every model family it supports, one parametrised matrix:

method × family × {apply, forward equals the layer's reference, save/load through the native path (base and Auto
classes, no trust_remote_code), save/load in a process where hf_tensorcompress cannot be imported (refused without
trust_remote_code, exact with it), compress-on-load (``from_pretrained(dense, quantization_config=config)``)}.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import run_without_library, tiny_causal_lm, tiny_time_series
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.runtime.contract import QUANTIZATION_MARKER, CompressedLayer

#: (method, family) -> the config options of that cell.
CASES: dict[tuple[str, str], dict] = {
    ("cp", "patchtst"): dict(rank=0.5, cp_iterations=2),
    ("cp", "autoformer"): dict(rank=0.5, cp_iterations=2),
    ("cp", "informer"): dict(rank=0.5, cp_iterations=2),
    ("svd", "patchtst"): dict(rank=0.5),
    ("svd", "autoformer"): dict(rank=0.5),
    ("svd", "informer"): dict(rank=0.5),
    ("biprop", "patchtst"): dict(keep_ratio=0.5, attention="qkv_mask"),
    ("biprop", "autoformer"): dict(keep_ratio=0.5, save_scores=True),
    ("biprop", "informer"): dict(keep_ratio=0.5),
    ("tt", "llama"): dict(tt_order=3, tt_ranks=2),
    ("tt", "gpt2"): dict(tt_order=3, tt_ranks=[2, 3]),
    ("tt", "opt"): dict(tt_shape=[4, 6], tt_eps=0.5),
    ("tiered", "llama"): dict(tier_tokens=[40], tier_bits=[8, 3], tier_group_size=8),
    ("lowbit", "patchtst"): dict(
        weight_bits=3, weight_group_size=8, bias_dtype="float16", input_rotation="randomized-hadamard", rotation_block=8
    ),
    ("lowbit", "autoformer"): dict(weight_bits="ternary", weight_group_size=8),
    ("lowbit", "informer"): dict(weight_bits=1, weight_group_size=None),
    ("lowbit", "llama"): dict(weight_bits=2, weight_group_size=8),
    ("lowbit", "gpt2"): dict(weight_bits=8, weight_group_size=8),
    # every form a Linear can take, one of them reusing another layer's Linear
    ("mixed", "patchtst"): dict(
        forms={
            "q_proj": {"method": "lowbit", "weight_bits": 4, "weight_group_size": 8},
            "k_proj": {"method": "svd", "rank": 0.5, "factor_bits": 4},
            "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
            "out_proj": {"method": "cp", "rank": 0.5, "cp_iterations": 2},
            "model.encoder.layers.1.self_attn.q_proj": {
                "method": "shared",
                "source": "model.encoder.layers.0.self_attn.q_proj",
            },
        }
    ),
}
#: One family per method runs in the fast tier; the other families are marked slow.
FAST = {
    ("cp", "patchtst"),
    ("svd", "patchtst"),
    ("biprop", "patchtst"),
    ("tt", "llama"),
    ("tiered", "llama"),
    ("lowbit", "patchtst"),
    ("mixed", "patchtst"),
}


def _registered_cases() -> dict[tuple[str, str], dict]:
    """A registered method the cases above do not name runs with its record's example config, on a tiny Llama where
    it replaces embeddings, else a tiny PatchTST: a new method is in the matrix without editing this file."""
    from torch import nn

    from hf_tensorcompress.core.registry import get_method, records

    named = {method for method, _ in CASES}
    return {
        (name, "llama" if nn.Embedding in get_method(name).accepts else "patchtst"): dict(record.example)
        for name, record in records().items()
        if name not in named
    }


CASES |= _registered_cases()
FAST |= {case for case in CASES if case[0] not in {method for method, _ in FAST}}
IDS = pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=() if case in FAST else pytest.mark.slow, id="-".join(case)) for case in CASES],
)
LM_FAMILIES = ("llama", "gpt2", "opt")


def config_of(case) -> CompressionConfig:
    method, _ = case
    return CompressionConfig(method=method, **CASES[case])


def dense_model(family: str):
    return tiny_causal_lm(family) if family in LM_FAMILIES else tiny_time_series(family)


def inputs_of(family: str, model) -> dict:
    if family in LM_FAMILIES:
        generator = torch.Generator().manual_seed(3)
        return {"input_ids": torch.randint(3, model.config.vocab_size, (2, 9), generator=generator)}
    from helpers import tiny_inputs

    return tiny_inputs("PatchTST" if family == "patchtst" else family, model)


def output_of(family: str, model, inputs) -> torch.Tensor:
    torch.manual_seed(123)  # Informer's ProbSparse attention samples keys
    with torch.no_grad():
        out = model(**inputs)
    if family in LM_FAMILIES:
        return out.logits
    params = getattr(out, "params", None)
    return torch.cat([p.flatten() for p in params]) if params is not None else out.prediction_outputs


def same_tensors(first: dict, second: dict) -> None:
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())[:6]
    for key in first:
        assert torch.equal(first[key], second[key]), key


WITHOUT_LIBRARY = """
import json, pathlib, sys, torch, transformers
from transformers import AutoModel, AutoModelForCausalLM
from transformers.utils import logging
logging.set_verbosity_error()
report = {}
for folder, base, family in json.loads(sys.argv[1]):
    auto = AutoModelForCausalLM if family in {lm_families!r} else AutoModel
    entry = {}
    for name, load in (("base", getattr(transformers, base).from_pretrained), ("auto", auto.from_pretrained)):
        try:
            load(folder)
            entry[name] = "loaded"
        except Exception as error:
            entry[name] = type(error).__name__ + ": " + str(error)
    model = auto.from_pretrained(folder, trust_remote_code=True).eval()
    io = torch.load(pathlib.Path(folder) / "io.pt")
    torch.manual_seed(123)
    with torch.no_grad():
        out = model(**io["inputs"])
    params = getattr(out, "params", None)
    value = out.logits if hasattr(out, "logits") else (
        torch.cat([p.flatten() for p in params]) if params is not None else out.prediction_outputs)
    entry["remote_class"] = type(model).__name__
    entry["remote_exact"] = bool(torch.equal(value, io["reference"]))
    report[folder] = entry
print(json.dumps(report))
""".replace("{lm_families!r}", repr(LM_FAMILIES))


class Matrix:
    """The cells, built on first use: the dense folder, the compressed model (apply), its folder and reference
    outputs. ``without_library(case)`` loads every cell built so far in one process where hf_tensorcompress cannot be
    imported (so the fast tier pays for one such process, the full run for one more at most)."""

    def __init__(self, root: Path) -> None:
        self.root, self.cells, self.report = root, {}, {}

    def __getitem__(self, case) -> dict:
        if case not in self.cells:
            method, family = case
            dense = self.root / f"dense-{method}-{family}"
            dense_model(family).save_pretrained(dense)
            base = type(dense_model(family))
            model = apply_compression(base.from_pretrained(dense), config_of(case))
            inputs = inputs_of(family, model)
            folder = self.root / f"{method}-{family}"
            model.save_pretrained(folder)
            reference = output_of(family, model, inputs)
            torch.save({"inputs": inputs, "reference": reference}, folder / "io.pt")
            self.cells[case] = dict(
                dense=dense, folder=folder, model=model, base=base, inputs=inputs, reference=reference
            )
        return self.cells[case]

    def without_library(self, case) -> dict:
        folder = str(self[case]["folder"])
        if folder not in self.report:
            todo = [
                (str(c["folder"]), c["base"].__name__, f)
                for (_, f), c in self.cells.items()
                if str(c["folder"]) not in self.report
            ]
            result = run_without_library(
                f"import sys; sys.argv[1:] = [{json.dumps(todo)!r}]\n" + WITHOUT_LIBRARY, cwd=self.root
            )
            self.report.update(json.loads(result.stdout.strip().splitlines()[-1]))
        return self.report[folder]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Matrix:
    return Matrix(tmp_path_factory.mktemp("matrix"))


@IDS
def test_apply(matrix, case):
    cell = matrix[case]
    model, base = cell["model"], cell["base"]
    assert isinstance(model, base) and type(model).__name__ == "Compressed" + base.__name__
    recorded = model.config.compression_config
    assert recorded["method"] == case[0] and recorded["modules"]
    for name, spec in recorded["modules"].items():
        layer = model.get_submodule(name)
        assert isinstance(layer, CompressedLayer) and layer.spec() == spec
    assert model.config.quantization_config == QUANTIZATION_MARKER
    assert all(ref.startswith("modeling_tensorcompress.Compressed") for ref in model.config.auto_map.values())


def reference_forward(layer: CompressedLayer, x: torch.Tensor) -> torch.Tensor:
    """What the layer computes, from its own definition: the dense weight its tensors represent."""
    if layer.layer_type in ("cp", "svd"):
        return F.linear(x, layer.dense_weight(), layer.bias)
    if layer.layer_type == "biprop":
        weight = layer.alpha * layer.signs().float() * layer.mask()
        return F.linear(x, weight, layer.bias)
    if layer.layer_type == "tiered_embedding":  # the tiers decoded whole, in stored order, then put in token order
        return F.embedding(x, torch.cat([tier.dequantize() for tier in layer.tiers])[layer.slot.long()])
    if layer.layer_type == "tt_embedding":
        return F.embedding(x, layer.weight)
    # another method: the dense weight the contract says it computes
    if hasattr(layer, "num_embeddings"):
        return F.embedding(x, layer.dense_weight())
    return F.linear(x, layer.dense_weight(), getattr(layer, "bias", None))


@IDS
def test_forward_equals_the_layers_reference(matrix, case):
    model = matrix[case]["model"]
    generator = torch.Generator().manual_seed(0)
    for name in model.config.compression_config["modules"]:
        layer = model.get_submodule(name)
        if hasattr(layer, "num_embeddings"):
            x = torch.randint(0, layer.num_embeddings, (3, 5), generator=generator)
        else:
            x = torch.randn(3, 5, layer.in_features, generator=generator)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), reference_forward(layer, x), atol=1e-5, rtol=1e-5)


@IDS
def test_native_save_and_load(matrix, case, tmp_path):
    """No trust_remote_code: the base class and the Auto class rebuild the compressed layers exactly; saving the
    loaded model again writes the same config.json byte for byte and the same tensors."""
    cell = matrix[case]
    folder, base, family = cell["folder"], cell["base"], case[1]
    loaded = base.from_pretrained(folder)
    assert type(loaded) is type(cell["model"])
    same_tensors(loaded.state_dict(), cell["model"].state_dict())
    assert torch.equal(output_of(family, loaded, cell["inputs"]), cell["reference"])
    auto = (AutoModelForCausalLM if family in LM_FAMILIES else AutoModel).from_pretrained(folder)
    assert type(auto).__name__.startswith("Compressed")
    prefix = "" if family in LM_FAMILIES else auto.base_model_prefix + "."
    expected = {k.removeprefix(prefix): v for k, v in cell["model"].state_dict().items() if k.startswith(prefix)}
    same_tensors(auto.state_dict(), expected)
    loaded.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    same_tensors(load_file(tmp_path / "model.safetensors"), load_file(folder / "model.safetensors"))


@IDS
def test_load_where_the_library_is_not_installed(matrix, case):
    """The plain class and the Auto class refuse (the tombstones are size mismatches); trust_remote_code is exact."""
    entry = matrix.without_library(case)
    for name in ("base", "auto"):
        assert entry[name].startswith("RuntimeError") and "ignore_mismatched_sizes" in entry[name], entry[name]
    assert entry["remote_class"] == "Compressed" + matrix[case]["base"].__name__
    assert entry["remote_exact"], entry


@IDS
def test_compress_on_load_equals_apply(matrix, case, tmp_path):
    cell = matrix[case]
    loaded = cell["base"].from_pretrained(cell["dense"], quantization_config=config_of(case))
    assert type(loaded) is type(cell["model"])
    assert getattr(loaded, "hf_quantizer", None) is None and not loaded.is_quantized
    same_tensors(loaded.state_dict(), cell["model"].state_dict())
    assert torch.equal(output_of(case[1], loaded, cell["inputs"]), cell["reference"])
    loaded.save_pretrained(tmp_path)
    folder = cell["folder"]
    assert (tmp_path / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    same_tensors(load_file(tmp_path / "model.safetensors"), load_file(folder / "model.safetensors"))


def test_every_method_and_layer_type_is_in_the_matrix():
    from hf_tensorcompress.core.registry import get_method, records

    assert {method for method, _ in CASES} == set(records()) == {method for method, _ in FAST}
    # every layer type a checkpoint can name belongs to a registered method (the scaled TT embedding, Gemma's, runs
    # the same checks in tests/test_families.py)
    shipped = {cls.layer_type for name in records() for cls in get_method(name).layers}
    assert set(CompressedLayer.types) == shipped


@pytest.mark.parametrize("case", sorted(FAST), ids="-".join)
def test_tombstones_are_what_a_plain_class_expects_in_the_wrong_shape(matrix, case):
    cell = matrix[case]
    tensors = load_file(Path(cell["folder"]) / "model.safetensors")
    dense = cell["base"].from_pretrained(cell["dense"]).state_dict()
    for name in cell["model"].config.compression_config["modules"]:
        tombstone = tensors[f"{name}.weight"]
        assert tombstone.dtype == torch.uint8 and tombstone.shape == () and dense[f"{name}.weight"].dim() == 2
