import pytest
import torch
from helpers import first_output, tiny_inputs, tiny_models
from torch import nn
from transformers import DistilBertConfig, DistilBertModel

from hf_tensorcompress import (
    CompressionConfig,
    CPLinear,
    LowRankLinear,
    UnsupportedModelError,
    apply_compression,
    compression_report,
)

MODELS = tiny_models()


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _forward(name, model):
    torch.manual_seed(123)  # Informer's ProbSparse attention samples keys
    with torch.no_grad():
        return first_output(model(**tiny_inputs(name, model)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cp_half_rank_keeps_at_most_55_percent_of_qkv(name):
    model = tiny_models()[name]
    expected = {n for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj")}
    apply_compression(model, CompressionConfig(method="cp", rank=0.5))
    report = compression_report(model)
    assert {row["name"] for row in report["modules"]} == expected  # encoder, decoder and cross attention
    assert all(isinstance(model.get_submodule(n), CPLinear) for n in expected)
    assert report["targets"]["params"] <= 0.55 * report["targets"]["dense_params"]
    assert isinstance(model, type(MODELS[name]))  # still the transformers class
    assert model.config.compression_config["method"] == "cp"
    assert torch.isfinite(_forward(name, model)).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_svd_at_full_rank_reproduces_the_dense_model(name):
    model = tiny_models()[name]
    dense = _forward(name, model)
    apply_compression(model, CompressionConfig(method="svd", rank=32))  # full rank of the 32×32 projections
    assert all(isinstance(model.get_submodule(n), LowRankLinear) for n in model.config.compression_config["modules"])
    torch.testing.assert_close(_forward(name, model), dense, atol=1e-5, rtol=1e-5)


def test_cp_close_to_dense_when_rank_is_large():
    name = "PatchTSTForPrediction"
    model = tiny_models()[name]
    dense = _forward(name, model)
    apply_compression(model, CompressionConfig(method="cp", rank=1.0, cp_iterations=300))
    half = tiny_models()[name]
    apply_compression(half, CompressionConfig(method="cp", rank=0.2))
    full_error = (_forward(name, model) - dense).abs().max()
    assert full_error < (_forward(name, half) - dense).abs().max()


def test_random_init_ignores_dense_weights():
    name = "PatchTSTForPrediction"
    a, b = tiny_models()[name], tiny_models()[name]
    with torch.no_grad():
        b.model.encoder.layers[0].self_attn.q_proj.weight.mul_(10)
    torch.manual_seed(5)
    apply_compression(a, CompressionConfig(method="cp", rank=4, init="random"))
    torch.manual_seed(5)
    apply_compression(b, CompressionConfig(method="cp", rank=4, init="random"))
    qa, qb = a.model.encoder.layers[0].self_attn.q_proj, b.model.encoder.layers[0].self_attn.q_proj
    torch.testing.assert_close(qa.weight, qb.weight)


def test_per_module_ranks_and_explicit_targets():
    model = tiny_models()["PatchTSTForPrediction"]
    config = CompressionConfig(
        method="cp", target_modules=["q_proj", "out_proj"], rank=3, ranks={"layers.1.self_attn.q_proj": 5}
    )
    apply_compression(model, config)
    modules = model.config.compression_config["modules"]
    assert sorted(n.rsplit(".", 1)[-1] for n in modules) == ["out_proj", "out_proj", "q_proj", "q_proj"]
    assert modules["model.encoder.layers.1.self_attn.q_proj"]["rank"] == 5
    assert modules["model.encoder.layers.0.self_attn.q_proj"]["rank"] == 3


def test_regex_targets_on_a_model_outside_the_family_table():
    model = DistilBertModel(DistilBertConfig(dim=32, n_layers=1, n_heads=4, hidden_dim=32, vocab_size=50))
    apply_compression(model, CompressionConfig(method="svd", target_modules=r".*attention\.(q|k)_lin", rank=4))
    assert len(model.config.compression_config["modules"]) == 2


def test_unsupported_model_names_the_supported_ones_and_is_untouched():
    model = DistilBertModel(DistilBertConfig(dim=32, n_layers=1, n_heads=4, hidden_dim=32, vocab_size=50))
    before = _snapshot(model)
    with pytest.raises(
        UnsupportedModelError,
        match="PatchTSTForPrediction.*AutoformerForPrediction|AutoformerForPrediction.*PatchTSTForPrediction",
    ):
        apply_compression(model, CompressionConfig(method="cp"))
    assert type(model) is DistilBertModel and not hasattr(model.config, "compression_config")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "config, message",
    [
        (CompressionConfig(method="svd", rank=33), "rank 33 is impossible.*at most 32"),
        (CompressionConfig(method="cp", rank=10**6), "impossible"),
        (CompressionConfig(method="cp", target_modules=["no_such_module"]), "matches no module"),
        (CompressionConfig(method="cp", target_modules=["self_attn"]), "replaces Linear, Conv1D modules"),
        # the last target is impossible: the earlier ones must not have been swapped either
        (CompressionConfig(method="svd", rank=4, ranks={"layers.1.self_attn.v_proj": 99}), "impossible"),
    ],
)
def test_bad_requests_fail_clearly_and_leave_the_model_untouched(config, message):
    model = tiny_models()["PatchTSTForPrediction"]
    before = _snapshot(model)
    with pytest.raises(ValueError, match=message):
        apply_compression(model, config)
    assert type(model) is type(MODELS["PatchTSTForPrediction"])
    assert not any(isinstance(m, (CPLinear, LowRankLinear)) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_compressing_twice_is_refused():
    model = tiny_models()["PatchTSTForPrediction"]
    apply_compression(model, CompressionConfig(method="cp", rank=2))
    with pytest.raises(ValueError, match="already compressed"):
        apply_compression(model, CompressionConfig(method="svd", rank=2))


def test_report_counts_flops_of_the_cheaper_path():
    model = tiny_models()["PatchTSTForPrediction"]
    apply_compression(model, CompressionConfig(method="cp", rank=2))
    row = compression_report(model, tokens=100)["modules"][0]
    layer = model.get_submodule(row["name"])
    assert row["flops"] == 2 * (100 * 2 * (32 + 32) + 32 * 2)
    assert row["dense_flops"] == 2 * 100 * 32 * 32
    assert row["params"] == 2 * (4 + 8 + 32) + 32 and row["dense_params"] == 32 * 32 + 32
    assert row["bits"] == 32 * row["params"] and layer.rank == 2


def test_cp_factors_do_not_depend_on_the_global_numpy_generator():
    """Ranks above a mode size make tensorly pad its SVD init with random columns: they must be seeded."""
    import numpy as np

    factors = []
    for state in (1, 2):
        model = tiny_models()["AutoformerForPrediction"]
        np.random.seed(state)
        apply_compression(model, CompressionConfig(method="cp", rank=1.0))
        factors.append([p.detach().clone() for n, p in model.named_parameters() if "factor" in n])
    assert factors[0] and all(torch.equal(a, b) for a, b in zip(*factors))
