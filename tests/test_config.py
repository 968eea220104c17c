import json

import pytest

from hf_tensorcompress import CompressionConfig


def test_json_round_trip_keeps_every_field(tmp_path):
    config = CompressionConfig(method="svd", target_modules=["q_proj", "v_proj"], rank=12, ranks={"layers.0.self_attn.q_proj": 0.25}, init="random")
    assert CompressionConfig.from_json_string(config.to_json_string()) == config
    path = tmp_path / "c.json"
    config.to_json_file(str(path))
    assert CompressionConfig.from_json_file(str(path)) == config
    assert json.loads(path.read_text())["version"] == 1


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
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        CompressionConfig(**kwargs)


def test_unknown_field_lists_known_fields():
    with pytest.raises(ValueError, match="unknown CompressionConfig field.*known fields"):
        CompressionConfig.from_dict({"method": "cp", "rnak": 3})


def test_rank_for_prefers_longest_matching_override():
    config = CompressionConfig(rank=0.5, ranks={"q_proj": 4, "layers.1.self_attn.q_proj": 7})
    assert config.rank_for("model.encoder.layers.0.self_attn.q_proj") == 4
    assert config.rank_for("model.encoder.layers.1.self_attn.q_proj") == 7
    assert config.rank_for("model.encoder.layers.1.self_attn.k_proj") == 0.5
