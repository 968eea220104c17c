"""Cross-domain parts of method "tt": dense-row priors, the equal-budget baselines, the mail corpus loader and the
cross-domain recipe (tiny model, small corpora written here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from helpers import save_word_level_lm
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.data.text import mail_body, text_dataset
from hf_tensorcompress.methods.tt.baselines import (
    dense_rows_svd_tail,
    frequency_only,
    rows_for_budget,
    tail_rank_for,
)
from hf_tensorcompress.methods.tt.calibration import exact_token_ids

from recipekit.domain_arms import exact_for_ratio

VOCAB, HIDDEN = 300, 24


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    ).eval()


def test_exact_priors_pick_calibration_counts_lowest_ids_or_half_of_each():
    counts = torch.zeros(10, dtype=torch.long)
    counts[[7, 3, 9]] = torch.tensor([5, 2, 1])
    assert exact_token_ids(counts, 4, "calibration").tolist() == [7, 3, 9, 0]
    assert exact_token_ids(counts, 4, "token_id").tolist() == [0, 1, 2, 3]
    assert exact_token_ids(counts, 4, "mixed").tolist() == [7, 3, 0, 1]  # half from the text, then lowest ids
    assert exact_token_ids(counts, 8, "mixed").tolist() == [7, 3, 9, 0, 1, 2, 4, 5]  # only 3 tokens were seen
    assert len(exact_token_ids(counts, 50, "mixed")) == 10
    with pytest.raises(ValueError, match="token_id"):
        exact_token_ids(counts, 4, "merges")
    with pytest.raises(ValueError, match="tt_exact_prior"):
        CompressionConfig(method="tt", tt_ranks=2, tt_exact_tokens=4, tt_exact_prior="merges")


def test_token_id_prior_needs_no_calibration_text_and_keeps_the_lowest_ids_exact():
    model = tiny_llama()
    dense = model.get_input_embeddings().weight.detach().clone()
    with pytest.raises(ValueError, match="calibration text"):
        apply_compression(tiny_llama(), CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_exact_tokens=50))
    config = CompressionConfig(method="tt", tt_order=3, tt_ranks=1, tt_exact_tokens=50, tt_exact_prior="token_id")
    layer = apply_compression(model, config).get_input_embeddings()
    assert torch.equal(layer.exact_slot >= 0, torch.arange(VOCAB) < 50)
    with torch.no_grad():
        assert torch.allclose(layer(torch.arange(50)), dense[:50])
        assert not torch.allclose(layer(torch.arange(50, 60)), dense[50:60], atol=1e-3)


def test_budget_helpers_fit_the_budget():
    assert rows_for_budget(10, 1000) == 99  # 99 rows + 1 fill row = 1000
    assert tail_rank_for(100, 10, 40, 40 * 10 + 3 * 70 + 5) == 3  # tail of 60 rows: k·(60 + 10)
    with pytest.raises(ValueError, match="not even rank 1"):
        tail_rank_for(100, 10, 99, 995)


def test_frequency_only_keeps_rows_and_shares_one_mean_row():
    model = tiny_llama()
    dense = model.get_input_embeddings().weight.detach().clone()
    kept = torch.tensor([5, 1, 200])
    assert frequency_only(model, kept) == 4 * HIDDEN
    weight = model.get_input_embeddings().weight.detach()
    assert torch.equal(weight[kept], dense[kept])
    dropped = torch.ones(VOCAB, dtype=torch.bool)
    dropped[kept] = False
    assert torch.allclose(weight[dropped], dense[dropped].mean(dim=0).expand(int(dropped.sum()), -1))
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_rows_plus_svd_tail_keeps_rows_and_the_output_aware_tail_has_the_lower_logit_error():
    kept, rank = torch.arange(40), 3
    plain, aware = tiny_llama(), tiny_llama()
    dense = plain.get_input_embeddings().weight.detach().clone()
    hidden = torch.randn(400, HIDDEN, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3, HIDDEN)
    covariance = (hidden.T.double() @ hidden.double()) / len(hidden)
    assert dense_rows_svd_tail(plain, kept, rank) == 40 * HIDDEN + rank * (VOCAB - 40 + HIDDEN)
    dense_rows_svd_tail(aware, kept, rank, covariance)
    errors = {}
    for name, model in (("plain", plain), ("aware", aware)):
        weight = model.get_input_embeddings().weight.detach()
        assert torch.equal(weight[kept], dense[kept])
        assert torch.linalg.matrix_rank(weight[40:].double(), rtol=1e-6) == rank
        errors[name] = float(((weight[40:] - dense[40:]) @ hidden.T).square().mean())  # logit error on h
    assert errors["aware"] < 0.9 * errors["plain"]


def test_mail_bodies_drop_the_headers(tmp_path):
    assert mail_body("From: a@b\r\nSubject: hi\r\n\r\nHello\n\nthere") == "Hello\n\nthere"
    assert mail_body("no headers at all") == "no headers at all"
    (tmp_path / "00002.json").write_text(json.dumps({"text": "From: x\nTo: y\n\nSecond mail."}))
    (tmp_path / "00001.json").write_text(json.dumps({"text": "From: x\n\nFirst mail."}))
    (tmp_path / "00003.json").write_text(json.dumps({"text": "Subject: headers only\n\n  "}))
    assert text_dataset(tmp_path, mail_bodies=True)["text"] == ["First mail.", "Second mail."]
    assert text_dataset(tmp_path)["text"][0] == "From: x\n\nFirst mail."


def load_recipe():
    path = Path(__file__).parents[1] / "recipes" / "tensorslm_domains.py"
    spec = importlib.util.spec_from_file_location("tensorslm_domains", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_domains_recipe_gives_every_arm_at_most_the_tt_budget_and_keeps_text_disjoint(tmp_path):
    """End to end on a tiny Llama and two small corpora of different vocabularies."""
    recipe = load_recipe()
    model_dir = save_word_level_lm(tmp_path / "model", 1200, 24)
    generator = torch.Generator().manual_seed(0)
    for name, low, high in (("low", 1, 300), ("high", 600, 1200)):
        folder = tmp_path / name
        folder.mkdir()
        for doc in range(8):
            words = torch.randint(low, high, (120,), generator=generator).tolist()
            header = "From: someone\n\n" if name == "high" else ""
            (folder / f"{doc}.json").write_text(json.dumps({"text": header + " ".join(f"w{w}" for w in words)}))
    results = recipe.main(
        [
            "--model",
            str(model_dir),
            "--corpus",
            f"low={tmp_path / 'low'}",
            "--corpus",
            f"high={tmp_path / 'high'}",
            "--mail-corpus",
            "high",
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
            "--byte-arms",
            "tt-calib-int8",
        ]
    )
    runs = results["runs"]
    # the 2× tt-calib arm stored in int8 codes: sized in stored bytes (codes, scales, int32 buffers), calibrated
    low_bit = [run for run in runs if run["arm"] == "tt-calib-int8"]
    assert {run["calibration"] for run in low_bit} == {"low", "high"} and low_bit[0]["embedding_params"] is None
    exact = exact_for_ratio(1200, 24, 2.0)  # trains of 9 values: 16 code bytes (8 a block) + scale + min
    codes = 1200 * (16 + 4) + (exact + 24) * (24 + 4) + 1200 * 3 * 4  # + token_ranks (V×2) and exact_slot int32
    assert all(run["embedding_bytes"] == codes for run in low_bit)
    runs = [run for run in runs if run["target_ratio"] is not None]
    budget = next(run["embedding_params"] for run in runs if run["arm"] == "tt-calib")
    assert budget == 1200 * (2 + 3 + 4) + 24 * 24 + exact_for_ratio(1200, 24, 2.0) * 24
    assert 1200 * 24 / budget == pytest.approx(2.0, rel=0.01)
    assert all(run["embedding_params"] <= budget for run in runs if not run["arm"].startswith("tt-"))
    assert all(2.0 <= run["compression_ratio"] < 2.2 for run in runs if run["arm"] != "tt-plain")  # rank granularity
    calibrated = {(run["arm"], run["calibration"], run["evaluation"]) for run in runs if run["calibration"]}
    assert ("freq-calib", "low", "high") in calibrated and ("tt-id", "high", "low") in calibrated
    assert {run["calibration"] for run in runs if run["arm"] in ("svd", "freq-id", "tt-plain")} == {None}
    assert results["corpora"]["low"]["held_out_documents"] == 2  # last 25 % of 8 documents
    # in domain, calibration counts cover the evaluation vocabulary; from the other corpus they miss all of it
    delta = {(run["arm"], run["calibration"], run["evaluation"]): run["delta_ln_ppl"] for run in runs}
    assert abs(delta[("freq-calib", "low", "low")]) < abs(delta[("freq-calib", "high", "low")])
    assert (tmp_path / "out" / "domains.png").stat().st_size > 1000
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| tt-calib | low | 2.00× |" in table and "(in)" in table and "| svd | 2.1" in table  # + summary
    common = ["--model", str(model_dir), "--corpus", f"low={tmp_path / 'low'}", "--output-dir", str(tmp_path / "x")]
    with pytest.raises(ValueError, match="no such arm; choose from"):
        recipe.main(common + ["--arms", "tt-magic"])
    with pytest.raises(ValueError, match="names no corpus"):
        recipe.main(common + ["--calibration-corpora", "high"])


@pytest.mark.slow
def test_domains_recipe_on_smollm2_loses_more_on_mail_than_in_domain(tmp_path):
    """The real model: calibrated on Moby Dick, both TT and dense rows + output-aware SVD tail at 2× stay close to
    dense on held-out Moby Dick and lose far more on held-out mails."""
    from hf_tensorcompress import assets

    results = load_recipe().main(
        [
            "--corpus",
            f"moby_dick={assets.moby_dick_dir()}",
            "--corpus",
            f"mail={assets.mail_dir()}",
            "--mail-corpus",
            "mail",
            "--calibration-corpora",
            "moby_dick",
            "--arms",
            "tt-calib",
            "rows+svd-output-calib",
            "--eval-tokens",
            "512",
            "--output-dir",
            str(tmp_path),
        ]
    )
    delta = {(run["arm"], run["evaluation"]): run["delta_ln_ppl"] for run in results["runs"]}
    assert len(delta) == 4
    for arm in ("tt-calib", "rows+svd-output-calib"):
        assert 0 < delta[(arm, "moby_dick")] < 0.3
        assert delta[(arm, "mail")] > 2 * delta[(arm, "moby_dick")]
    assert all(run["compression_ratio"] >= 2.0 for run in results["runs"])


def test_the_budget_arm_gives_the_same_bytes_and_loss_on_a_renumbered_vocabulary(tmp_path):
    """``--permute-vocabulary``: the same model under other token ids; the ``size_ratio`` arm does not notice."""
    recipe = load_recipe()
    model_dir = save_word_level_lm(tmp_path / "model", 1200, 64)
    generator = torch.Generator().manual_seed(0)
    for name in ("text", "other"):
        (tmp_path / name).mkdir()
        for doc in range(8):
            words = (torch.rand(150, generator=generator) ** 2 * 1199 + 1).long().tolist()
            (tmp_path / name / f"{doc}.json").write_text(json.dumps({"text": " ".join(f"w{w}" for w in words)}))
    common = [
        "--model",
        str(model_dir),
        "--corpus",
        f"text={tmp_path / 'text'}",
        "--corpus",
        f"other={tmp_path / 'other'}",
    ]
    common += ["--calibration-corpora", "text", "--ratios", "--eval-tokens", "200"]
    common += ["--window", "32", "--stride", "32", "--covariance-tokens", "128", "--byte-arms", "tiered-budget-4x"]
    runs = {}
    for name, extra in (("original", []), ("renumbered", ["--permute-vocabulary", "3"])):
        results = recipe.main(common + ["--output-dir", str(tmp_path / name), *extra])
        assert results["settings"]["permute_vocabulary"] == (3 if extra else None)
        runs[name] = next(run for run in results["runs"] if run["evaluation"] == "other")
    assert runs["original"]["embedding_bytes"] == runs["renumbered"]["embedding_bytes"]
    assert runs["original"]["smaller_than_bf16"] == pytest.approx(4.0, rel=0.01)
    assert runs["renumbered"]["delta_ln_ppl"] == pytest.approx(runs["original"]["delta_ln_ppl"], abs=1e-4)
