"""TensorSLM figures: compression ratio (Eq. 21), energy estimates (Eq. 2-5), matrix-SVD baseline, recipe smoke."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tensorcompress.methods.tt.energy import (
    apply_svd_embedding,
    compression_ratio,
    energy_report,
    eta,
    svd_rank_for,
)


def test_ratio_and_eta_follow_eq_21_and_eta_ttd():
    hidden, per_token = 576, 8 * 5 + 5 * 8 * 5 + 5 * 9  # SmolLM2, 8x8x9 at ranks (5, 5)
    assert per_token == 285
    assert eta(49152 * hidden, 49152 * per_token) == pytest.approx(hidden / per_token - 1)
    assert compression_ratio(49152 * hidden, 49152 * per_token) == pytest.approx(2.0210526)


def test_energy_follows_eq_2_to_5_with_nu_over_tau_5():
    vocab, hidden, length, rank = 1000, 64, 10, 8
    report = energy_report(vocab, hidden, length, tt_per_token=40.0, svd_rank=rank)
    assert report["dense"]["total"] == hidden * vocab + length * hidden
    assert report["tt"]["memory"] == vocab * 40 + length * 40 + length * hidden
    assert report["tt"]["compute"] == pytest.approx(40 / 5)
    assert report["svd"]["memory"] == rank * (vocab + 2 * hidden + length + 1) + length * hidden
    assert report["svd"]["compute"] == pytest.approx((2 * length * hidden * rank - length * hidden + rank * hidden) / 5)
    assert report["tt"]["ratio"] == pytest.approx(report["tt"]["total"] / report["dense"]["total"])
    assert report["tt"]["ratio"] < 1


def test_svd_baseline_has_the_budgeted_rank_and_keeps_the_output_tied():
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=100,
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    )
    rank = svd_rank_for(100, 16, 100 * 8)
    assert rank == 800 // 116
    params = apply_svd_embedding(model, rank)
    assert params == rank * 116
    assert torch.linalg.matrix_rank(model.get_input_embeddings().weight.detach().double(), rtol=1e-5) == rank
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_recipe_smoke_writes_results_and_plot(tmp_path):
    """The recipe end to end on a tiny random Llama and a few hundred tokens of the State of the Union."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hf_tensorcompress import assets

    spec = importlib.util.spec_from_file_location(
        "tensorslm_recipe", Path(__file__).parents[1] / "recipes" / "tensorslm.py"
    )
    tensorslm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tensorslm)

    torch.manual_seed(0)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)} | {"[UNK]": 96}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model_dir = tmp_path / "model"
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(model_dir)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=72,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    ).save_pretrained(model_dir)
    results = tensorslm.main(
        [
            "--model",
            str(model_dir),
            "--dataset",
            str(assets.sotu_dir()),
            "--sweep",
            "smoke",
            "--output-dir",
            str(tmp_path / "out"),
            "--eval-tokens",
            "300",
            "--window",
            "64",
            "--stride",
            "32",
            "--heal-steps",
            "3",
            "--heal-tokens",
            "128",
            "--tt-solver",
            "power",
            "--quant-arms",
            "bnb-int8-row",
            "bnb-nf4-b64",
        ]
    )
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    names = [run["name"] for run in written["runs"]]
    assert names[0] == "dense" and any(n.startswith("svd-k") for n in names)
    assert {"tt3-r5", "tt3-r5-untied", "tt3-r5-output"} <= set(names)
    tt = next(run for run in written["runs"] if run["name"] == "tt3-r5")
    output = next(run for run in written["runs"] if run["name"] == "tt3-r5-output")
    assert output["tt_basis"] == "output" and output["embedding_params"] == tt["embedding_params"] + 72 * 72  # + basis
    assert set(tt) >= {
        "name",
        "tt_shape",
        "tt_ranks",
        "embedding_params",
        "compression_ratio",
        "perplexity",
        "delta_ln_ppl",
        "energy_ratio",
        "compress_seconds",
    }
    assert tt["tt_solver"] == "power"
    quantized = {run["name"]: run for run in written["runs"] if run["method"] == "quantization"}
    assert set(quantized) == {"bnb-int8-row", "bnb-nf4-b64"} and quantized["bnb-nf4-b64"]["library"] == "bitsandbytes"
    assert quantized["bnb-int8-row"]["embedding_bytes"] == 97 * 72 + 97 * 4  # int8 codes + an fp32 absmax per row
    assert abs(quantized["bnb-int8-row"]["delta_ln_ppl"]) < abs(quantized["bnb-nf4-b64"]["delta_ln_ppl"]) + 0.01
    assert tt["tt_shape"] == [3, 4, 6] and tt["tt_ranks"] == [3, 5]  # balanced 72 = 3x4x6; ranks capped at 3, 6
    assert tt["compression_ratio"] == pytest.approx(97 * 72 / tt["embedding_params"])
    healed = next(run for run in written["runs"] if run["name"] == "tt3-r5-output-exact64-healed")
    assert healed["heal_steps"] == 3 and healed["heal_seconds"] > 0 and tt["heal_steps"] == 0
    by_name = {run["name"]: run for run in written["runs"]}
    baselines = [run for run in written["runs"] if run["method"] in ("svd", "frequency-only", "rows+svd")]
    assert {"svd", "rows+svd"} <= {run["method"] for run in baselines}  # frequency-only needs a TT run below dense
    for run in baselines:  # at most the parameters of the TT run they stand beside
        assert run["embedding_params"] <= by_name[run["same_size_as"]]["embedding_params"]
    rows = next(run for run in baselines if run["method"] == "rows+svd")
    assert rows["name"].startswith("rows64+svd") and rows["name"].endswith("-output")
    assert len({run["name"] for run in written["runs"]}) == len(written["runs"])  # no baseline twice
    assert (tmp_path / "out" / "tradeoff.png").stat().st_size > 1000
