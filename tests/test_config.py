import json

import pytest

from hf_tensorcompress import BipropConfig, CompressionConfig, CPConfig, TTConfig


def test_json_round_trip_keeps_every_field(tmp_path):
    config = CompressionConfig(
        method="svd",
        target_modules=["q_proj", "v_proj"],
        rank=12,
        ranks={"layers.0.self_attn.q_proj": 0.25},
        init="random",
    )
    assert CompressionConfig.from_json_string(config.to_json_string()) == config
    path = tmp_path / "c.json"
    config.to_json_file(str(path))
    assert CompressionConfig.from_json_file(str(path)) == config
    assert json.loads(path.read_text())["version"] == 2


def test_regex_targets_round_trip():
    config = CompressionConfig(target_modules=r".*encoder.*\.(q|k)_proj")
    assert CompressionConfig.from_dict(config.to_dict()).target_modules == config.target_modules


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "tucker"}, "choose one of"),
        ({"rank": 0}, "int >= 1"),
        ({"rank": 1.5}, "outside (0, 1]"),
        ({"rank": 0.0}, "outside (0, 1]"),
        ({"rank": True}, "int >= 1 or a float"),
        ({"rank": "half"}, "int >= 1 or a float"),
        ({"ranks": {"q_proj": -2}}, "ranks['q_proj']"),
        ({"ranks": [3]}, "must be a dict"),
        ({"target_modules": []}, "non-empty list"),
        ({"target_modules": "q_proj("}, "not a valid regex"),
        ({"init": "zeros"}, "choose one of"),
        ({"cp_iterations": 0}, "cp_iterations"),
        ({"version": 99}, "upgrade hf_tensorcompress"),
    ],
)
def test_invalid_values_say_what_would_be_right(kwargs, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        CompressionConfig(**kwargs)


def test_unknown_field_lists_known_fields():
    with pytest.raises(
        ValueError, match="CPConfig .* has no such option: 'rnak' is not an option of any method.*It takes"
    ):
        CompressionConfig.from_dict({"method": "cp", "rnak": 3})


@pytest.mark.parametrize(
    "method, field, owner",
    [
        ("cp", "tt_ranks", "TTConfig"),
        ("svd", "keep_ratio", "BipropConfig"),
        ("tt", "rank", "CPConfig"),
        ("biprop", "cp_iterations", "CPConfig"),
    ],
)
def test_an_option_of_another_method_names_its_config(method, field, owner):
    with pytest.raises(ValueError, match=f"'{field}' is an option of {owner}"):
        CompressionConfig(method=method, **{field: 5})
    with pytest.raises(ValueError, match=f"'{field}' is an option of {owner}"):
        CompressionConfig.from_dict({"method": method, field: 5, "version": 2})


def test_each_method_gets_its_own_config_class():
    assert [
        type(CompressionConfig(method=m, tt_ranks=3) if m == "tt" else CompressionConfig(method=m)).__name__
        for m in ("cp", "svd", "biprop", "tt")
    ] == ["CPConfig", "SVDConfig", "BipropConfig", "TTConfig"]
    assert CPConfig(rank=3) == CompressionConfig(method="cp", rank=3)
    assert isinstance(TTConfig(tt_ranks=2), CompressionConfig)
    with pytest.raises(ValueError, match="configures method='cp', not 'svd'"):
        CPConfig(method="svd")


#: ``compression_config`` of a biprop PatchTST as version 1 of the library wrote it: one flat config with every
#: method's fields (the unused ones at their defaults).
VERSION_1 = {
    "attention": "qkv_mask",
    "attention_keep_ratio": 0.5,
    "attention_length": 4,
    "attention_modules": ["model.encoder.layers.0.self_attn"],
    "cp_iterations": 100,
    "init": "decompose",
    "keep_ratio": 0.5,
    "method": "biprop",
    "modules": {},
    "rank": 0.5,
    "ranks": {},
    "save_scores": False,
    "target_modules": None,
    "tt_basis": "identity",
    "tt_eps": None,
    "tt_exact_tokens": 0,
    "tt_order": None,
    "tt_ranks": None,
    "tt_shape": None,
    "tt_solver": "eigh",
    "tt_untie_output": False,
    "version": 1,
    "weight_init": "kaiming_normal",
    "weight_seed": 0,
}


def test_a_version_1_config_reads_as_its_method_config():
    config = CompressionConfig.from_dict(VERSION_1)
    assert isinstance(config, BipropConfig)
    assert (config.attention, config.attention_length, config.keep_ratio) == ("qkv_mask", 4, 0.5)
    assert config.to_dict()["version"] == 2 and "tt_basis" not in config.to_dict()


def test_rank_for_prefers_longest_matching_override():
    config = CompressionConfig(rank=0.5, ranks={"q_proj": 4, "layers.1.self_attn.q_proj": 7})
    assert config.rank_for("model.encoder.layers.0.self_attn.q_proj") == 4
    assert config.rank_for("model.encoder.layers.1.self_attn.q_proj") == 7
    assert config.rank_for("model.encoder.layers.1.self_attn.k_proj") == 0.5
