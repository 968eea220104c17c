"""A compressed model is recognised by what it is (its compression_config and layers), whatever its class object:
compressing it again is refused with "already compressed" and leaves it untouched, also when its class comes from
``transformers_modules`` (trust_remote_code). Configs are accepted as dicts or JSON text."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_causal_lm, tiny_patchtst_config
from transformers import AutoModel, AutoModelForCausalLM, PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression


def patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(tiny_patchtst_config()).eval()


def state(model) -> tuple:
    return type(model), {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_json_string()


def assert_same(before: tuple, after: tuple) -> None:
    assert before[0] is after[0] and before[2] == after[2]
    assert before[1].keys() == after[1].keys() and all(torch.equal(before[1][k], after[1][k]) for k in before[1])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("recompress")
    apply_compression(patchtst(), CompressionConfig(method="cp", rank=2, cp_iterations=1)).save_pretrained(root / "cp")
    lm = apply_compression(tiny_causal_lm("llama"), CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    lm.save_pretrained(root / "tt")
    return root


@pytest.mark.parametrize(
    "config",
    [
        dict(method="svd", target_modules=["out_proj"]),
        dict(method="cp", cp_iterations=1),
        dict(method="biprop"),
    ],
)
def test_a_remote_code_model_is_refused_as_already_compressed(folders, config, tmp_path):
    model = AutoModel.from_pretrained(folders / "cp", trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules")
    before = state(model)
    with pytest.raises(ValueError, match=r"already compressed \(method 'cp', 6 modules\).*dense checkpoint"):
        apply_compression(model, CompressionConfig(**config))
    assert_same(before, state(model))
    model.save_pretrained(tmp_path / "again")  # still saves whole: nothing half-written
    assert json.loads((tmp_path / "again" / "config.json").read_text())["compression_config"]["method"] == "cp"


def test_a_remote_code_tt_model_is_refused_as_already_compressed(folders):
    model = AutoModelForCausalLM.from_pretrained(folders / "tt", trust_remote_code=True)
    before = state(model)
    with pytest.raises(ValueError, match=r"already compressed \(method 'tt'"):
        apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=2))
    assert_same(before, state(model))


def test_a_library_loaded_model_is_refused_too(folders):
    model = PatchTSTForPrediction.from_pretrained(folders / "cp")
    with pytest.raises(ValueError, match="already compressed"):
        apply_compression(model, CompressionConfig(method="svd", target_modules=["out_proj"]))


@pytest.mark.parametrize("form", ["dict", "json"])
def test_a_config_as_a_dict_or_json_text_is_read_by_from_dict(form):
    options = {"method": "svd", "rank": 2}
    given = options if form == "dict" else json.dumps(options)
    model = apply_compression(patchtst(), given)
    reference = apply_compression(patchtst(), CompressionConfig(**options))
    assert model.config.compression_config == reference.config.compression_config


@pytest.mark.parametrize(
    "given, error, shown",
    [
        ("cp", ValueError, "CompressionConfig(method=..."),
        (["cp"], TypeError, "CompressionConfig.from_dict({'method': 'cp'"),
        ({"method": "nope"}, ValueError, "'nope' is not supported; choose one of ['biprop', 'cp'"),
        ({"method": "cp", "tt_order": 3}, ValueError, "an option of TTConfig"),
    ],
)
def test_a_config_in_another_form_is_refused_showing_the_right_call(given, error, shown):
    model = patchtst()
    before = state(model)
    with pytest.raises(error) as raised:
        apply_compression(model, given)
    assert shown in str(raised.value)
    assert_same(before, state(model))
