"""The equal-size baselines of the rank search: one rank everywhere, random ranks, per-module ranks."""

from __future__ import annotations

import random

from smartformer_fixtures import tiny_patchtst

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.search import attention_groups
from hf_tensorcompress.search.baselines import module_ranks, random_ranks, total_params, uniform_ranks


def test_uniform_ranks_take_the_closest_count():
    groups = attention_groups(tiny_patchtst(layers=3))  # a rank costs 72, biases 48 per group
    searched = {groups[0].name: 2, groups[1].name: 4, groups[2].name: 9}  # 15 ranks -> 5 each is exact
    assert uniform_ranks(groups, total_params(groups, searched)) == {g.name: 5 for g in groups}
    assert uniform_ranks(groups, total_params(groups, searched) + 100) == {g.name: 5 for g in groups}
    assert uniform_ranks(groups, total_params(groups, searched) + 150) == {g.name: 6 for g in groups}


def test_random_ranks_spend_the_count_and_differ_between_draws():
    groups = attention_groups(tiny_patchtst(layers=3))
    params = total_params(groups, {g.name: 5 for g in groups})
    draws = [random_ranks(groups, params, random.Random(seed)) for seed in range(20)]
    for ranks in draws:
        # never above the count, and less than one rank-1 component (72) below it
        assert params - 72 < total_params(groups, ranks) <= params
        assert all(1 <= ranks[g.name] <= max(g.candidates) for g in groups)
    assert len({tuple(r.values()) for r in draws}) > 5  # not the uniform assignment in disguise
    assert random_ranks(groups, params, random.Random(3)) == draws[3]  # reproducible from the seed


def test_random_ranks_at_a_count_below_rank_one_everywhere_keep_rank_one():
    groups = attention_groups(tiny_patchtst(layers=2))
    assert random_ranks(groups, 10, random.Random(0)) == {g.name: 1 for g in groups}


def test_module_ranks_build_the_model_the_ranks_describe():
    groups = attention_groups(tiny_patchtst(layers=2))
    ranks = {groups[0].name: 3, groups[1].name: 7}
    dense = tiny_patchtst(method="svd", rank=1.0, layers=2)  # any model of the same shapes; only names matter
    config = CompressionConfig(method="cp", rank=1.0, ranks=module_ranks(groups, ranks))
    model = apply_compression(_dense(), config)
    assert all(model.get_submodule(m).rank == ranks[g.name] for g in groups for m in g.modules)
    assert total_params(groups, ranks) == sum(
        p.numel() for g in groups for m in g.modules for p in model.get_submodule(m).parameters()
    )
    assert set(module_ranks(groups, ranks)) == {m for g in attention_groups(dense) for m in g.modules}


def _dense():
    import torch
    from smartformer_fixtures import CHANNELS, CONTEXT, HORIZON
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    torch.manual_seed(0)
    return PatchTSTForPrediction(
        PatchTSTConfig(
            num_input_channels=CHANNELS,
            context_length=CONTEXT,
            patch_length=8,
            patch_stride=8,
            d_model=16,
            num_attention_heads=4,
            num_hidden_layers=2,
            ffn_dim=32,
            prediction_length=HORIZON,
        )
    )
