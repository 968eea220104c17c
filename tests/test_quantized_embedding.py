"""The embedding's quantization arms (maintained libraries + hand-written round-to-nearest below 4 bits) and the
cross-domain recipe comparing them with the tiered method in bytes."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import save_word_level_lm
from test_tt_domains import load_recipe
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tensorcompress.evaluation.quantized_embedding import QUANT_ARMS, quantize_embedding

#: bits per weight each arm stores on a 192-wide matrix (codes + scales, zero points, nested statistics); torchao
#: keeps int4 codes unpacked, one a byte, on x86
EXPECTED_BITS = {
    "torchao-int8-row": 8 + 40 / 192,
    "torchao-int4-g64": 8 + 40 / 64,
    "bnb-int8-row": 8 + 32 / 192,
    "gguf-q8_0": 8.5,
    "gguf-q5_0": 5.5,
    "gguf-q4_1": 5.0,
    "gguf-q4_0": 4.5,
    "rtn-int4-g64": 4.5,
    "rtn-int3-g64": 3.5,
    "rtn-int2-g64": 2.5,
}


def test_every_arm_stores_what_its_library_stores_and_loses_more_at_fewer_bits():
    torch.manual_seed(0)
    weight = torch.randn(256, 192)
    errors, bits = {}, {}
    for name, (quantize, _) in QUANT_ARMS.items():
        values, stored = quantize(weight)
        assert values.shape == weight.shape
        errors[name] = float((values - weight).norm() / weight.norm())
        bits[name] = stored * 8 / weight.numel()
    for name, expected in EXPECTED_BITS.items():
        assert bits[name] == pytest.approx(expected, abs=0.02), name
    assert 4.1 < bits["bnb-nf4-b64"] < 4.4  # 4 + nested absmax + a fixed 256-entry code table (small matrix)
    assert bits["rtn-int3-g192"] == pytest.approx(3 + 32 / 192)
    assert errors["torchao-int8-row"] < 0.01 and errors["bnb-int8-row"] < 0.01
    assert (
        errors["gguf-q8_0"]
        < errors["gguf-q5_0"]
        < errors["gguf-q4_0"]
        < errors["rtn-int3-g64"]
        < errors["rtn-int2-g64"]
    )


def test_quantize_embedding_writes_the_values_back_and_names_the_arms():
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    )
    before = model.get_input_embeddings().weight.detach().clone()
    assert quantize_embedding(model, "gguf-q4_0") == 64 * 64 * 4.5 / 8
    after = model.get_input_embeddings().weight
    assert after is model.lm_head.weight and not torch.equal(after, before)
    with pytest.raises(ValueError, match="choose one of"):
        quantize_embedding(model, "int5")


def test_the_domains_recipe_compares_every_arm_in_bytes_with_a_pareto_front(tmp_path):
    model_dir = save_word_level_lm(tmp_path / "model", 400, 64)
    generator = torch.Generator().manual_seed(0)
    for name, low, high in (("low", 1, 150), ("high", 200, 400)):
        (tmp_path / name).mkdir()
        for doc in range(8):
            words = torch.randint(low, high, (100,), generator=generator).tolist()
            (tmp_path / name / f"{doc}.json").write_text(json.dumps({"text": " ".join(f"w{w}" for w in words)}))
    arms = ["bnb-int8-row", "gguf-q4_0", "rtn-int2-g64", "tiered-int4", "tiered-int3"]
    results = load_recipe().main(
        [
            "--model",
            str(model_dir),
            "--corpus",
            f"low={tmp_path / 'low'}",
            "--corpus",
            f"high={tmp_path / 'high'}",
            "--output-dir",
            str(tmp_path / "out"),
            "--eval-tokens",
            "100",
            "--window",
            "32",
            "--stride",
            "32",
            "--covariance-tokens",
            "64",
            "--ratios",
            "--byte-arms",
            *arms,
        ]
    )
    runs = results["runs"]
    assert {run["arm"] for run in runs} == set(arms)
    assert {run["calibration"] for run in runs if run["arm"] == "tiered-int3"} == {"low", "high"}
    assert {run["calibration"] for run in runs if run["arm"] == "gguf-q4_0"} == {None}
    size = {run["arm"]: run["smaller_than_bf16"] for run in runs}
    assert size["gguf-q4_0"] == pytest.approx(16 / 4.5) and size["tiered-int3"] > size["tiered-int4"] > 3
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| bnb-int8-row | 1.88× |" in table and "★" in table
    assert (tmp_path / "out" / "bytes.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="no such arm"):
        load_recipe().main(
            [
                "--model",
                str(model_dir),
                "--corpus",
                f"low={tmp_path / 'low'}",
                "--output-dir",
                str(tmp_path / "x"),
                "--byte-arms",
                "int5",
            ]
        )


@pytest.mark.slow
def test_on_smollm2_the_4x_tiered_embedding_loses_less_than_int4_round_to_nearest(tmp_path):
    """The real model: calibrated on Moby Dick, scored on held-out State of the Union text, the tiered setting at
    ≥ 4× smaller than bf16 loses less than int4 (groups of 64) round-to-nearest at 3.56×."""
    from hf_tensorcompress import assets

    results = load_recipe().main(
        [
            "--corpus",
            f"moby_dick={assets.moby_dick_dir()}",
            "--corpus",
            f"sotu={assets.sotu_dir()}",
            "--calibration-corpora",
            "moby_dick",
            "--ratios",
            "--byte-arms",
            "rtn-int4-g64",
            "tiered-int4/int3-20k",
            "--eval-tokens",
            "1024",
            "--output-dir",
            str(tmp_path),
        ]
    )
    runs = {(run["arm"], run["evaluation"]): run for run in results["runs"]}
    tiered, rtn = runs[("tiered-int4/int3-20k", "sotu")], runs[("rtn-int4-g64", "sotu")]
    assert tiered["smaller_than_bf16"] >= 4.0 > rtn["smaller_than_bf16"] > 3.5
    assert 0 < tiered["delta_ln_ppl"] < rtn["delta_ln_ppl"]
