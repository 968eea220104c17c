"""Errors leave the model untouched (state dict, class, config), and are the library's own messages."""

from __future__ import annotations

import pytest
import torch
from helpers import LM_VOCAB, tiny_causal_lm, tiny_patchtst_config
from torch import nn
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression


def snapshot(model: nn.Module) -> tuple:
    config = getattr(model, "config", None)
    return (
        type(model),
        {key: value.clone() for key, value in model.state_dict().items()},
        None if config is None else config.to_json_string(),
    )


def assert_untouched(model: nn.Module, before: tuple) -> None:
    kind, state, config = snapshot(model)
    assert kind is before[0]
    assert state.keys() == before[1].keys() and all(torch.equal(state[k], before[1][k]) for k in state)
    assert config == before[2]


def patchtst(config=None) -> PatchTSTForPrediction:
    torch.manual_seed(0)
    return PatchTSTForPrediction(config or tiny_patchtst_config()).eval()


def test_a_plain_module_is_refused_before_anything_changes():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    before = snapshot(model)
    with pytest.raises(TypeError, match="compresses transformers models.*Sequential"):
        apply_compression(model, CompressionConfig(method="svd", target_modules=["0"], rank=2))
    assert_untouched(model, before)


def test_a_rank_override_matching_no_module_is_an_error():
    model = patchtst()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"ranks keys \['nope'\] match no compressed module"):
        apply_compression(model, CompressionConfig(method="svd", ranks={"nope": 3, "q_proj": 2}))
    assert_untouched(model, before)


@pytest.mark.parametrize("config", [dict(method="tt", tt_ranks=2), dict(method="tiered", tier_bits=[4])])
def test_an_embedding_method_on_a_model_without_token_embedding_says_so(config):
    model = patchtst()
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"has no token embedding: method '{config['method']}' compresses"):
        apply_compression(model, CompressionConfig(**config))
    assert_untouched(model, before)


def test_a_config_shared_with_another_model_is_left_alone(tmp_path):
    config = tiny_patchtst_config()
    first, second = patchtst(config), patchtst(config)
    assert first.config is second.config
    before = snapshot(second)
    apply_compression(first, CompressionConfig(method="svd", rank=2))
    assert_untouched(second, before)
    assert not hasattr(second.config, "compression_config") and not hasattr(second.config, "quantization_config")
    assert first.config is not config and first.model.encoder.layers[0].self_attn.config is first.config
    second.save_pretrained(tmp_path)
    assert type(PatchTSTForPrediction.from_pretrained(tmp_path)) is PatchTSTForPrediction


def test_a_float_codebook_size_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"codebook_size must be an int >= 1 \(one of \[256, 1024"):
        CompressionConfig(method="tiered", tier_tokens=[20], tier_bits=[4, "codebook"], codebook_size=1024.0)
    with pytest.raises(ValueError, match="low_rank_bits must be an int"):
        CompressionConfig(method="tiered", low_rank=2, low_rank_bits=8.0)


TIERED = dict(method="tiered", tier_tokens=[20], tier_bits=[8, 4], tier_order="calibration", rounding="output")
TT = dict(method="tt", tt_ranks=2, tt_basis="output")
BAD_CALIBRATION = [
    (torch.tensor([[3, 5, LM_VOCAB]]), {}, rf"calibration_ids must be token ids in \[0, {LM_VOCAB}\).*to {LM_VOCAB}"),
    (torch.tensor([[3, -1, 5]]), {}, r"token ids in \[0, .*from -1 to 5"),
    (torch.empty(1, 0, dtype=torch.long), {}, "calibration_ids is empty"),
    (torch.tensor([[3.0, 5.0]]), {}, "must hold integer token ids, got dtype torch.float32"),
    ([3, 5, 7], {}, "calibration_ids must be a torch.Tensor of token ids"),
    (torch.tensor([[3, 5, 7]]), {"covariance_tokens": 0}, "covariance_tokens must be an int >= 1"),
]


@pytest.mark.parametrize(("apply", "options"), [("apply_tiered", TIERED), ("apply_tt", TT)])
@pytest.mark.parametrize(("ids", "extra", "message"), BAD_CALIBRATION)
def test_bad_calibration_ids_are_refused_before_anything_changes(apply, options, ids, extra, message):
    from hf_tensorcompress import apply_tiered, apply_tt

    function = {"apply_tiered": apply_tiered, "apply_tt": apply_tt}[apply]
    model = tiny_causal_lm("llama")
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"{apply}: .*{message}"):
        function(model, CompressionConfig(**options), ids, **extra)
    assert_untouched(model, before)


@pytest.mark.parametrize(
    "method, options, family",
    [
        ("cp", {"rank": 0.5, "cp_iterations": 2}, "patchtst"),
        ("svd", {"rank": 0.5}, "patchtst"),
        ("tt", {"tt_ranks": 2, "tt_order": 3}, "llama"),
        ("tiered", {"tier_tokens": [40], "tier_bits": [8, 3], "tier_group_size": 8}, "llama"),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_weights_are_refused_naming_the_module_before_anything_changes(method, options, family, bad):
    """cp, svd and tt stopped in a decomposition with a raw LinAlgError naming no module; tiered stored the value and
    saved a checkpoint its own loader refused."""
    model = patchtst() if family == "patchtst" else tiny_causal_lm("llama")
    name = "model.encoder.layers.1.self_attn.k_proj" if family == "patchtst" else "model.embed_tokens"
    with torch.no_grad():
        model.get_submodule(name).weight[3, 5] = bad
    kind, state, config = snapshot(model)
    with pytest.raises(ValueError, match=rf"{name}\.weight holds .*\(the first at index \[3, 5\]\).*nothing was"):
        apply_compression(model, CompressionConfig(method=method, **options))
    assert type(model) is kind and model.config.to_json_string() == config
    after = model.state_dict()
    assert after.keys() == state.keys()
    for key in state:
        torch.testing.assert_close(after[key], state[key], rtol=0, atol=0, equal_nan=True)


def test_the_finite_check_reads_every_chunk_of_a_large_table(monkeypatch):
    """``all_finite`` reads a table a chunk at a time (``torch.isfinite`` on a 262k-token embedding peaks at 1.1 GB):
    a value in any chunk, the last partial one too, is found."""
    from hf_tensorcompress import compress

    monkeypatch.setattr(compress, "FINITE_CHUNK", 7)
    table = torch.zeros(10, 5)
    assert compress.all_finite(table)
    for index in (0, 6, 7, 48, 49):
        for bad in (float("nan"), float("inf"), float("-inf")):
            broken = table.clone()
            broken.view(-1)[index] = bad
            assert not compress.all_finite(broken), (index, bad)
