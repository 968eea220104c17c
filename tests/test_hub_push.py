"""push_to_hub against the Hub emulator: code, weights and card arrive; the model loads where the library cannot."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_without_library, tiny_time_series
from huggingface_hub import ModelCard
from transformers import LlamaConfig, LlamaForCausalLM, PatchTSTConfig, PatchTSTForPrediction

from hf_tensorcompress import CardInfo, CompressionConfig, PushError, apply_compression, push_to_hub
from hf_tensorcompress.core.export import shipped_files
from hf_tensorcompress.core.registry import get_method, records

#: A small compressed model per method whose round trip is tested here (every registered method needs one).
ROUND_TRIPS = {
    "cp": CompressionConfig(method="cp", rank=3, cp_iterations=5),
    "svd": CompressionConfig(method="svd", rank=4),
    "biprop": CompressionConfig(method="biprop", keep_ratio=0.5),
    "lowbit": CompressionConfig(method="lowbit", weight_bits=3, weight_group_size=8),
    "mixed": CompressionConfig(
        method="mixed",
        forms={
            "q_proj": {"method": "lowbit", "weight_bits": 2, "weight_group_size": 16},
            "k_proj": {"method": "svd", "rank": 4, "factor_bits": 4, "factor_group_size": 4},
            "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
            "out_proj": {"method": "cp", "rank": 3, "cp_iterations": 5, "factor_bits": "ternary"},
        },
    ),
}
#: Methods for causal LMs, round-tripped on a small Llama (the SmolLM2 architecture).
LM_ROUND_TRIPS = {
    "tt": CompressionConfig(method="tt", tt_shape=[4, 4, 4], tt_ranks=3),
    "tiered": CompressionConfig(method="tiered", tier_tokens=[32], tier_bits=[8, 4], tier_group_size=32),
}


def code_files(method: str) -> set[str]:
    """The shipped modeling code of ``method`` (under its checkpoint names), which must reach the repo."""
    return {f"{name}.py" for name in shipped_files([get_method(method)]).values()}


RESULTS = {
    "dataset": "appliances_energy",
    "runs": [
        {"name": "dense", "seed": 0, "metrics": {"mse": 0.61, "mae": 0.52}},
        {"name": "dense", "seed": 1, "metrics": {"mse": 0.63, "mae": 0.54}},
        {"name": "compressed", "seed": 0, "metrics": {"mse": 0.655, "mae": 0.571}},
    ],
}


def small_patchtst() -> PatchTSTForPrediction:
    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        prediction_length=8,
        d_model=16,
        num_attention_heads=2,
        num_hidden_layers=2,
        ffn_dim=32,
    )
    return PatchTSTForPrediction(config).eval()


def test_every_method_has_a_round_trip_test():
    covered = set(ROUND_TRIPS) | set(LM_ROUND_TRIPS)
    methods = set(records())
    assert methods <= covered, f"add a ROUND_TRIPS entry for {methods - covered}"


@pytest.mark.parametrize(  # cp in the fast tier; the other methods' round trips in the slow tier
    "method", [pytest.param(m, marks=() if m == "cp" else pytest.mark.slow) for m in sorted(ROUND_TRIPS)]
)
def test_push_then_load_without_the_library(hub, repo_id, method, tmp_path):
    model = apply_compression(small_patchtst(), ROUND_TRIPS[method])
    inputs = torch.randn(2, 32, 3)
    torch.save(inputs, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = model(past_values=inputs).prediction_outputs
    info = CardInfo(results=RESULTS, run="compressed", dataset_note="UCI Appliances Energy (a substitute for ETTh1)")

    push_to_hub(model, repo_id, info)

    files = hub.files(repo_id)
    assert {"config.json", "model.safetensors", "README.md", *code_files(method)} <= set(files)
    assert ("POST", f"/{repo_id}.git/info/lfs/objects/batch") in hub.state.requests  # weights went through git-lfs
    config = json.loads(files["config.json"])
    assert config["compression_config"]["method"] == method
    assert config["auto_map"]["AutoModel"].startswith("modeling_tensorcompress.Compressed")

    card = ModelCard.load(repo_id)
    card.validate()  # the emulator applies the Hub's metadata rules
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "time-series-forecasting"
    assert {"hf_tensorcompress", method}.issubset(card.data.tags)
    assert card.data.metrics == ["mae", "mse"] and card.data.datasets == ["appliances_energy"]
    assert "| dense | 2 | 0.53 | 0.62 |" in card.text  # dense beside compressed, averaged over seeds
    assert "| **compressed** (this model) | 1 | 0.571 | 0.655 |" in card.text
    assert f'AutoModel.from_pretrained("{repo_id}", trust_remote_code=True)' in card.text

    # Load where hf_tensorcompress cannot be imported, re-push from there, and load the re-pushed copy.
    result = run_without_library(
        f"""
        import json, torch
        from transformers import AutoModel
        inputs = torch.load("{tmp_path / "inputs.pt"}")
        outputs = {{}}
        for name in ("{repo_id}", "{repo_id}-again"):
            model = AutoModel.from_pretrained(name, trust_remote_code=True).eval()
            with torch.no_grad():
                outputs[name] = model(past_values=inputs).prediction_outputs
            if name == "{repo_id}":
                model.push_to_hub("{repo_id}-again")
        torch.save(outputs, "{tmp_path / "outputs.pt"}")
        print(json.dumps({{"class": type(model).__name__, "module": type(model).__module__}}))
    """,
        cwd=tmp_path,
    )
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["class"].startswith("Compressed") and loaded["module"].startswith("transformers_modules.")
    outputs = torch.load(tmp_path / "outputs.pt")
    for name in (repo_id, f"{repo_id}-again"):
        torch.testing.assert_close(outputs[name], expected, atol=1e-6, rtol=0)
    again = hub.files(f"{repo_id}-again")
    # the code files survive a re-push from a model loaded with remote code
    assert {name: again.get(name) for name in code_files(method)} == {name: files[name] for name in code_files(method)}


@pytest.mark.parametrize(  # tt in the fast tier, tiered in the slow one
    "method", [pytest.param(m, marks=() if m == "tt" else pytest.mark.slow) for m in sorted(LM_ROUND_TRIPS)]
)
def test_causal_lm_push_then_load_without_the_library(hub, repo_id, method, tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = apply_compression(LlamaForCausalLM(config).eval(), LM_ROUND_TRIPS[method])
    prompt = torch.tensor([[1, 5, 9, 17, 33]])
    torch.save(prompt, tmp_path / "prompt.pt")
    with torch.no_grad():
        expected_logits = model(prompt).logits
    expected_tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)

    push_to_hub(model, repo_id)

    files = hub.files(repo_id)
    assert {"config.json", "model.safetensors", "README.md", *code_files(method)} <= set(files)
    card = ModelCard.load(repo_id)
    card.validate()
    assert card.data.pipeline_tag == "text-generation" and method in card.data.tags
    run_without_library(
        f"""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True).eval()
        prompt = torch.load("{tmp_path / "prompt.pt"}")
        with torch.no_grad():
            logits = model(prompt).logits
        tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)
        torch.save({{"logits": logits, "tokens": tokens}}, "{tmp_path / "outputs.pt"}")
    """,
        cwd=tmp_path,
    )
    outputs = torch.load(tmp_path / "outputs.pt")
    torch.testing.assert_close(outputs["logits"], expected_logits, atol=1e-6, rtol=0)
    assert torch.equal(outputs["tokens"], expected_tokens)


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_json_string(), type(model)


@pytest.mark.parametrize("case", ["bad_token", "foreign_namespace"])
def test_refused_push_is_clear_and_leaves_the_model_alone(hub, case, monkeypatch):
    model = apply_compression(small_patchtst(), ROUND_TRIPS["cp"])
    before = _snapshot(model)
    repos_before = set(hub.state.repos)
    if case == "bad_token":
        monkeypatch.setenv("HF_TOKEN", "hf_revoked_token")
        with pytest.raises(PushError, match="rejected the token .*HTTP 401.*HF_TOKEN"):
            push_to_hub(model, f"{hub.USER}/never-created")
    else:
        with pytest.raises(PushError, match="Could not push to 'someone-else/missing-repo' \\(HTTP 403\\)"):
            push_to_hub(model, "someone-else/missing-repo")
    assert set(hub.state.repos) == repos_before
    after = _snapshot(model)
    assert after[1:] == before[1:]
    assert all(torch.equal(before[0][key], value) for key, value in after[0].items())


def test_the_card_describes_the_method_from_its_registry_record():
    from hf_tensorcompress import CompressionConfig, apply_compression, model_card
    from hf_tensorcompress.core.registry import record

    assert all(entry.description for entry in records().values())
    model = apply_compression(tiny_time_series("patchtst"), CompressionConfig(method="svd", rank=2))
    assert " ".join(record("svd").description.split()) in " ".join(str(model_card(model)).split())
