"""The Smartformer search in bytes: per searched Linear a rank and a factor width, a byte budget as stored, factors
trained at the chosen widths, saved packed with per-layer ``factor_bits`` and loaded back scoring the same."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from smartformer_fixtures import assert_forecasts_in_new_processes, dense_patchtst, sines
from transformers import PatchTSTForPrediction, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.loading import load_model
from hf_tensorcompress.runtime.marker import FACTOR_WIDTHS
from hf_tensorcompress.search import SearchConfig, attention_groups
from hf_tensorcompress.search.form_swap import LATENT_FILE, coded_parameters
from hf_tensorcompress.search.space import allowed_actions
from hf_tensorcompress.search.trainer import SmartformerTrainer

WIDTHS = (8, 4, 2)


def every_linear_svd(seed: int = 0) -> PatchTSTForPrediction:
    """A tiny PatchTST whose every Linear with both sides >= 16 is ``U Vᵀ`` at full rank (the dense weight)."""
    model = dense_patchtst(layers=1, seed=seed)
    ranks = {
        name: min(m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and min(m.in_features, m.out_features) >= 16
    }
    return apply_compression(model, CompressionConfig(method="svd", target_modules=list(ranks), rank=1.0, ranks=ranks))


def searched_bytes(model, groups) -> tuple[int, int]:
    rows = linear_bytes(model)["modules"]
    names = [name for group in groups for name in group.modules]
    return sum(rows[name]["disk"] for name in names), sum(rows[name]["dense"] for name in names)


def test_byte_costs_match_what_the_layers_store():
    model = every_linear_svd()
    groups = attention_groups(model, 10, FACTOR_WIDTHS, 32)
    for group in groups:
        rank = group.candidates[0]
        for name in group.modules:
            model.get_submodule(name).set_rank(rank)
        for width in FACTOR_WIDTHS:
            for name in group.modules:
                model.get_submodule(name).set_factor_bits(width, 32)
            stored = sum(model.get_submodule(name).storage_bits() / 8 for name in group.modules)
            assert group.bytes_at(rank, width) == pytest.approx(stored)
        assert group.bytes_at(rank, "ternary") < group.bytes_at(rank, 2)  # five codes a byte, one level per group
        assert group.bytes_at(rank, 16) == 2 * rank * group.params_per_rank + 4 * group.bias_params  # bf16, no scales
        assert group.bytes_at(rank, None) == 4 * group.params_at(rank)
        assert {action[1] for action in group.actions} == set(FACTOR_WIDTHS)


def test_byte_wall_offers_only_actions_that_keep_the_budget_reachable():
    groups = attention_groups(every_linear_svd(), 10, WIDTHS, 32)
    ranks = {g.name: (max(g.candidates), None) for g in groups}
    width = max(len(g.actions) for g in groups)
    mask = allowed_actions(groups, 0, ranks, set(), 1 / 4, width, in_bytes=True)
    limit = sum(g.dense_bytes for g in groups) / 4
    cheapest = sum(min(g.bytes_at(*a) for a in g.actions) for g in groups[1:])
    for slot, ok in enumerate(mask[: len(groups[0].actions)]):
        assert ok == (cheapest + groups[0].bytes_at(*groups[0].actions[slot]) <= limit)
    assert any(mask) and not all(mask[: len(groups[0].actions)])
    unreachable = allowed_actions(groups, 0, ranks, set(), 1e-4, width, in_bytes=True)
    assert sum(unreachable) == 1  # only the cheapest action: the wall cannot be met, the search still ends


def test_config_checks_the_byte_fields():
    with pytest.raises(ValueError, match="not both"):
        SearchConfig(byte_budget=0.1, param_budget=0.5)
    with pytest.raises(ValueError, match="factor_widths"):
        SearchConfig(factor_widths=(5,))
    with pytest.raises(
        ValueError, match=r"factor_widths=\['tern'\]: distinct values among \[16, 8, 4, 3, 2, 'ternary', 1\]"
    ):
        SearchConfig(factor_widths=("tern",))
    with pytest.raises(ValueError, match="distinct"):
        SearchConfig(factor_widths=("ternary", "ternary"))
    for widths in ((8, None), (16, 8, 4, 3, 2, "ternary", None)):
        config = SearchConfig(byte_budget=1 / 16, factor_widths=widths)
        assert SearchConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize("widths,budget", [(WIDTHS, 1 / 6), ((16,), 1 / 4), (("ternary",), 1 / 6)])
def test_search_in_bytes_meets_its_budget_and_saves_packed_widths(tmp_path, widths, budget):
    """``budget``: the tiny model's biases and scales leave nothing below ~1/7.5; a single width is chosen for sure."""
    search_save_and_reload(tmp_path, widths, budget)


def search_save_and_reload(tmp_path, widths: tuple, budget: float) -> None:
    """A short byte search among ``widths`` within ``budget``; the model saved to ``saved`` and loaded back packed,
    scoring the same (inputs and outputs in ``io.pt``)."""
    model = every_linear_svd()
    search = SearchConfig(
        interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=budget, factor_widths=widths
    )
    args = TrainingArguments(
        str(tmp_path / "run"), max_steps=20, per_device_train_batch_size=16, learning_rate=1e-3, report_to=[],
        use_cpu=True, save_strategy="no",
    )  # fmt: skip
    trainer = SmartformerTrainer(model=model, args=args, train_dataset=sines(400), search=search)
    trainer.train()
    assert trainer.search.done
    disk, dense = searched_bytes(trainer.model, trainer.search.groups)
    assert disk <= budget * dense
    modules = trainer.model.config.compression_config["modules"]
    chosen = {spec["factor_bits"] for spec in modules.values()}
    assert chosen <= set(widths) and (len(widths) > 1 or chosen == set(widths))
    for group in trainer.search.groups:  # the layers hold what the search decided
        assert all(modules[name]["factor_bits"] == trainer.search.bits[group.name] for name in group.modules)
        assert all(modules[name]["rank"] == trainer.search.ranks[group.name] for name in group.modules)
    trainer.model.eval()
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        expected = trainer.model(past_values=past).prediction_outputs
    folder = tmp_path / "saved"
    trainer.model.save_pretrained(folder)
    loaded = load_model(folder).eval()
    assert all(loaded.get_submodule(name).stored for name in modules)  # packed in RAM
    with torch.no_grad():
        assert torch.allclose(loaded(past_values=past).prediction_outputs, expected, atol=1e-5)
    torch.save({"past": past, "expected": expected}, tmp_path / "io.pt")


@pytest.mark.slow
def test_searched_model_loads_in_a_new_process_natively_and_with_remote_code(tmp_path):
    search_save_and_reload(tmp_path, (16, 8, 4, 2, "ternary"), 1 / 6)
    assert_forecasts_in_new_processes(tmp_path)


@pytest.mark.slow
def test_byte_search_resumes_from_a_checkpoint_where_it_stopped(tmp_path):
    """A checkpoint inside the search holds low-bit factors at the chosen ranks; resuming rebuilds the trainable
    layers at those ranks and widths and continues with the same decisions as an uninterrupted run."""
    widths = (16, 4, 2, "ternary")
    search = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=1 / 6, factor_widths=widths)

    def trainer_for(folder: str, steps: int) -> SmartformerTrainer:
        args = TrainingArguments(
            str(tmp_path / folder), max_steps=steps, per_device_train_batch_size=16, learning_rate=1e-3,
            report_to=[], use_cpu=True, save_strategy="steps", save_steps=6, seed=0, data_seed=0,
        )  # fmt: skip
        return SmartformerTrainer(
            model=every_linear_svd(), args=args, train_dataset=sines(400), search=SearchConfig(**search)
        )

    whole = trainer_for("whole", 12)
    whole.train()
    (tmp_path / "part").mkdir()
    first = trainer_for("part", 6)
    first.train()
    assert any(spec.get("factor_bits") for spec in first.model.config.compression_config["modules"].values())
    kept = load_file(tmp_path / "part" / "checkpoint-6" / LATENT_FILE)  # the fp32 factors behind the codes
    coded = coded_parameters(first.model)
    assert kept.keys() == coded.keys() and any(name.endswith("factor_out") for name in kept)
    assert all(torch.equal(kept[name], parameter.detach()) for name, parameter in coded.items())
    resumed = trainer_for("part", 12)
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-6"))
    assert resumed.search.bits == whole.search.bits and resumed.search.ranks == whole.search.ranks
    assert [r.get("bits") for r in resumed.search.trace] == [r.get("bits") for r in whole.search.trace]
    again = trainer_for("again", 12)  # loaded, not trained: the factors are where the first run stopped
    again._load_from_checkpoint(str(tmp_path / "part" / "checkpoint-6"))
    assert all(torch.equal(kept[name], parameter) for name, parameter in coded_parameters(again.model).items())
