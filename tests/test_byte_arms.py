"""The equal-bytes baselines of the byte search (uniform, random and greedy allocations, int-N weight QAT) and the
naive forecasts beside them."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from test_byte_search import WIDTHS, every_linear_svd
from transformers import PatchTSTForPrediction

from hf_tensorcompress.evaluation.naive import evaluate_naive, naive_forecast, natural_seasons
from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from hf_tensorcompress.search import attention_groups
from hf_tensorcompress.search.allocators import allocation_bytes, greedy_allocation, random_allocation
from tests.helpers import tiny_patchtst_config

from recipekit.byte_arms import (
    BYTE_WIDTHS,
    dense_fraction,
    ends_arm,
    lowbit_arm,
    prepare_ends,
    prepare_int_qat,
    prepare_lowbit,
    prepare_rows,
    rotation_block,
    rows_arm,
)
from recipekit.costs import model_flops
from recipekit.forecasters import MEDIUM
from recipekit.narrow_arms import narrow_arm, narrower
from recipekit.vector_arms import prepare_vq, vq_arm


@pytest.fixture(scope="module")
def groups():
    return attention_groups(every_linear_svd(), 10, WIDTHS, 32)


def test_allocations_stay_within_the_bytes_they_are_given(groups):
    budget = 0.3 * sum(g.dense_bytes for g in groups)
    for draw in range(5):
        assert allocation_bytes(groups, random_allocation(groups, budget, random.Random(draw))) <= budget
    assert len({tuple(random_allocation(groups, budget, random.Random(d)).items()) for d in range(5)}) > 1


def test_greedy_allocation_gives_bytes_to_the_sensitive_layer(groups):
    """With one group costly to shrink and the other free, the greedy allocator shrinks the free one first."""
    budget = 0.3 * sum(g.dense_bytes for g in groups)
    costly, free = groups[0].name, groups[1].name
    sensitivity = {
        costly: {a: 1.0 / groups[0].bytes_at(*a) for a in groups[0].actions},
        free: {a: 0.0 for a in groups[1].actions},
    }
    allocation = greedy_allocation(groups, budget, sensitivity)
    assert allocation_bytes(groups, allocation) <= budget
    assert allocation[free] == min(groups[1].actions, key=lambda a: groups[1].bytes_at(*a))
    assert groups[0].bytes_at(*allocation[costly]) > groups[1].bytes_at(*allocation[free])


def test_greedy_and_random_allocations_choose_among_16_bit_and_ternary_factors():
    groups = attention_groups(every_linear_svd(), 10, BYTE_WIDTHS, 32)
    assert {16, "ternary"} <= {bits for g in groups for _, bits in g.actions}
    everything = sum(max(g.bytes_at(*a) for a in g.actions) for g in groups)
    indifferent = {g.name: {a: 0.0 for a in g.actions} for g in groups}
    roomy = greedy_allocation(groups, everything, indifferent)
    assert {bits for _, bits in roomy.values()} == {16}  # nothing to cut: full rank in 16 bits, the costliest action
    budget = sum(g.dense_bytes for g in groups) / 6
    twins = attention_groups(every_linear_svd(), 10, (2, "ternary"), 32)  # every rank at either width, ternary cheaper
    tied = greedy_allocation(twins, budget, {g.name: {a: 0.0 for a in g.actions} for g in twins})
    assert allocation_bytes(twins, tied) <= budget
    # every other action loses more the fewer bytes it keeps; ternary loses nothing (and costs less than int2)
    ternary_is_free = {
        g.name: {a: 0.0 if a[1] == "ternary" else 1 + 1 / g.bytes_at(*a) for a in g.actions} for g in groups
    }
    greedy = greedy_allocation(groups, budget, ternary_is_free)
    assert allocation_bytes(groups, greedy) <= budget and {bits for _, bits in greedy.values()} == {"ternary"}
    drawn = [random_allocation(groups, budget, random.Random(draw)) for draw in range(20)]
    assert all(allocation_bytes(groups, allocation) <= budget for allocation in drawn)
    assert {"ternary", 16} <= {bits for allocation in drawn for _, bits in allocation.values()}


def test_the_recipes_take_16_bit_and_ternary_factor_widths(capsys):
    import smartformer
    from byte_comparison import parse_args

    assert smartformer.parse_args([]).factor_widths == [16, 8, 4, 3, 2, "ternary"]
    assert smartformer.parse_args(["--factor-widths", "16", "Ternary", "1"]).factor_widths == [16, "ternary", 1]
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--factor-widths", "5"])
    assert "'5': choose among 16 8 4 3 2 ternary 1" in capsys.readouterr().err
    assert parse_args(["--factor-widths", "16", "ternary"]).factor_widths == ["16", "ternary"]  # passed on as given


def test_the_recipes_take_the_byte_search_start_form(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    assert smartformer.parse_args([]).search_start == "dense"
    assert smartformer.parse_args(["--search-start", "lowbit:2/g32"]).search_start == "lowbit:2/g32"
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--search-start", "lowbit:2"])
    error = capsys.readouterr().err
    assert "form 'lowbit:2': one of dense, lowbit:<bits>/<g<group>|row>" in error and "or greedy" in error
    args = comparison_args(["--search-start", "lowbit:2/g32"])
    assert passed(args)[-2:] == ["--search-start", "lowbit:2/g32"]  # the byte comparison passes it on
    assert passed(comparison_args(["--search-start", "greedy"]))[-2:] == ["--search-start", "greedy"]
    assert smartformer.parse_args([]).weight_scales == ["rounded"]
    assert smartformer.parse_args(["--weight-scales", "learned"]).weight_scales == ["learned"]
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--weight-scales", "lsq"])
    assert "invalid choice: 'lsq'" in capsys.readouterr().err
    assert passed(comparison_args(["--weight-scales", "learned"])) == ["--weight-scales", "learned"]
    assert smartformer.parse_args([]).input_rotations == ["none"]
    rotations = ["--input-rotations", "none", "hadamard"]
    assert smartformer.parse_args(rotations).input_rotations == ["none", "hadamard"]
    assert passed(comparison_args(rotations)) == rotations
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--input-rotations", "givens"])
    assert "invalid choice: 'givens'" in capsys.readouterr().err
    assert smartformer.parse_args([]).share_by == "fp32_bytes"
    assert smartformer.parse_args(["--share-by", "sensitivity"]).share_by == "sensitivity"
    assert passed(comparison_args(["--share-by", "sensitivity"])) == ["--share-by", "sensitivity"]
    assert smartformer.parse_args([]).pace == 0.5 and smartformer.parse_args(["--pace", "0.25"]).pace == 0.25
    assert smartformer.parse_args(["--pace", "None"]).pace is None
    assert passed(comparison_args(["--pace", "0.25"])) == ["--pace", "0.25"]
    for wrong in ("-0.1", "fast", "nan"):
        with pytest.raises(SystemExit):
            smartformer.parse_args(["--pace", wrong])
        assert "a fraction >= 0 (e.g. 0.25) or none" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--share-by", "size"])
    assert "invalid choice: 'size'" in capsys.readouterr().err
    assert smartformer.parse_args([]).bias_dtype == "model"
    assert passed(comparison_args(["--bias-dtype", "float16"])) == ["--bias-dtype", "float16"]
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--bias-dtype", "float32"])


def test_the_recipes_take_the_byte_search_passes(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    assert smartformer.parse_args([]).search_episodes == 1
    args = smartformer.parse_args(["--search-episodes", "3", "--budget-ratio", "1/16", "--forms", "lowbit"])
    assert search_factory(MEDIUM, args)(0, in_bytes=True).episodes == 3  # what the search runs with
    assert search_factory(MEDIUM, smartformer.parse_args([]))(0).episodes == 1  # the rank search: one pass
    for wrong, said in (("0", "0 must be >= 1"), ("two", "'two' is not a whole number"), ("-1", "-1 must be >= 1")):
        with pytest.raises(SystemExit):
            smartformer.parse_args(["--search-episodes", wrong])
        assert said in capsys.readouterr().err
    assert passed(comparison_args(["--search-episodes", "3"])) == ["--search-episodes", "3"]


def test_the_recipes_take_the_byte_search_reward_baseline(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    flags = ["--budget-ratio", "1/16", "--forms", "lowbit", "--byte-reward", "validation_loss"]
    assert search_factory(MEDIUM, smartformer.parse_args(flags))(0, in_bytes=True).reward_baseline == "previous_stage"
    args = smartformer.parse_args([*flags, "--reward-baseline", "same_weights"])
    assert search_factory(MEDIUM, args)(0, in_bytes=True).reward_baseline == "same_weights"
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--reward-baseline", "now"])
    assert "invalid choice: 'now'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--reward-baseline", "same_weights"])  # the training loss is no held-out score
    assert "add --byte-reward validation_loss (got --byte-reward loss)" in capsys.readouterr().err
    assert passed(comparison_args(["--reward-baseline", "same_weights"])) == ["--reward-baseline", "same_weights"]


def test_lowbit_arm_names():
    assert lowbit_arm("lowbit-2-g128") == (2, 128, "rounded", "model", "none")
    assert lowbit_arm("lowbit-ternary-g64")[:2] == ("ternary", 64)
    assert lowbit_arm("lowbit-ternary-g128-learned") == ("ternary", 128, "learned", "model", "none")
    assert lowbit_arm("lowbit-ternary-g128-learned-fp16-bias") == ("ternary", 128, "learned", "float16", "none")
    assert lowbit_arm("lowbit-1-g128-learned-fp16-bias-hadamard") == (1, 128, "learned", "float16", "hadamard")
    assert lowbit_arm("lowbit-5-g32") is None and lowbit_arm("qat-int2-all") is None
    assert lowbit_arm("lowbit-2-g128-hadamard-fp16-bias") is None  # the suffixes in their one order
    after = "lowbit-ternary-g128-learned-fp16-bias-hadamard-after-dense-0.9"
    assert lowbit_arm(after) == ("ternary", 128, "learned", "float16", "hadamard") and dense_fraction(after) == 0.9
    assert dense_fraction("lowbit-2-g128") is None and lowbit_arm("lowbit-2-g128-after-dense-0") is None
    from byte_comparison import parse_args

    assert parse_args(["--runs", after]).runs == [after]


def test_narrow_arm_names_and_widths():
    assert narrow_arm("narrow-64") == ((64, None, None, False), None)
    assert narrow_arm("narrow-64-lowbit-ternary-g128-learned") == (
        (64, None, None, False),
        "lowbit-ternary-g128-learned",
    )
    assert narrow_arm("narrow-80-ends-8-4-hadamard") == ((80, None, None, False), "ends-8-4-hadamard")
    assert narrow_arm("narrow-112x1-ends-8-4-hadamard") == ((112, 1, None, False), "ends-8-4-hadamard")
    assert narrow_arm("narrow-96x2-ffn64-ends-8-4-hadamard") == ((96, 2, 64, False), "ends-8-4-hadamard")
    assert narrow_arm("narrow-128-ffn128") == ((128, None, 128, False), None)
    assert narrow_arm("narrow-64-vq-4-3") == ((64, None, None, False), "vq-4-3")
    assert narrow_arm("narrow-64-rows-4-0.1") == ((64, None, None, False), "rows-4-0.1")
    assert narrow_arm("narrow-112x2-shared-ends-8-4-hadamard") == ((112, 2, None, True), "ends-8-4-hadamard")
    assert narrow_arm("narrow-128-ffn48-shared-ends-8-4-1") == ((128, None, 48, True), "ends-8-4-1")
    for refused in (
        "narrow-064",
        "narrow-64-qat-int2-all",
        "narrow-0",
        "narrow-64-narrow-32",
        "narrow-64x0",
        "narrow-64x",
        "narrow-64-ffn0",
        "narrow-64-ffn",
        "narrow-64-ffn64x2",
        "narrow-64-ends-8-4-shared",
        "narrow-64-shared-shared",
    ):
        assert narrow_arm(refused) is None, refused
    narrow = narrower(MEDIUM, (64, None, None, False))
    assert (narrow.d_model, narrow.heads, narrow.ffn, narrow.encoder_layers, narrow.steps) == (
        64,
        4,
        128,
        2,
        MEDIUM.steps,
    )
    deeper, shallower = narrower(MEDIUM, (64, 3, None, False)), narrower(MEDIUM, (128, 1, None, False))
    assert (deeper.d_model, deeper.ffn, deeper.encoder_layers) == (64, 128, 3)
    assert (shallower.d_model, shallower.heads, shallower.ffn, shallower.encoder_layers) == (128, 8, 256, 1)
    thin = narrower(MEDIUM, (96, 2, 64, False))
    assert (thin.d_model, thin.heads, thin.ffn, thin.encoder_layers) == (96, 6, 64, 2)
    assert narrower(MEDIUM, (128, None, 128, False)).ffn == 128
    for shape in (
        (128, None, None, False),
        (128, 2, None, False),
        (128, 2, 256, False),
        (128, 3, 512, False),
        (144, 1, None, False),
        (72, 1, None, False),
    ):
        with pytest.raises(ValueError):
            narrower(MEDIUM, shape)
    shared = narrower(MEDIUM, (128, None, None, True))  # the full shape, its second layer reusing the first's Linears
    assert (shared.d_model, shared.ffn, shared.encoder_layers) == (128, 256, 2)
    with pytest.raises(ValueError, match="one encoder layer has no later layer to share its Linears"):
        narrower(MEDIUM, (112, 1, None, True))
    from byte_comparison import parse_args

    for name in (
        "narrow-32-lowbit-8-g32",
        "narrow-80-ends-8-4-hadamard",
        "narrow-112x1-ends-8-4-hadamard",
        "narrow-96x2-ffn64-ends-8-4-hadamard",
        "narrow-112x2-shared-ends-8-4-hadamard",
    ):
        assert parse_args(["--runs", name]).runs == [name]


def test_int_qat_trains_rounded_weights_and_counts_their_codes():
    dense = torch.nn.Sequential(torch.nn.Linear(64, 32))
    packed = prepare_int_qat(2)(dense, None)
    weight = dense[0].weight
    assert len(torch.unique(weight[0, :32])) <= 4  # 2-bit codes in a group of 32
    assert packed["0"] < 64 * 32 * 4 / 8 + 32 * 4  # 2-bit codes with their scales, and the fp32 bias
    dense(torch.randn(3, 64)).sum().backward()
    assert dense[0].parametrizations.weight.original.grad is not None  # straight-through to the fp32 latent


def test_the_rows_arm_trains_two_widths_in_one_weight_and_counts_both():
    assert rows_arm("rows-4-0.045") == (4, 0.045) and rows_arm("rows-ternary-0.1") is rows_arm("rows-4-0.0") is None
    layer = torch.nn.Linear(256, 40)
    packed = prepare_rows(4, 0.1)(torch.nn.Sequential(layer), None)
    weight = layer.weight
    assert all(len(torch.unique(row[:128])) <= 16 for row in weight[:4])  # 4 wide rows: 4-bit codes
    assert len(torch.unique(weight[4:, :128])) > 3 and all(len(torch.unique(row[:128])) <= 3 for row in weight[4:])
    assert torch.equal(layer.bias, layer.bias.half().float())
    ternary = 36 * 52 * 8 + 36 * 2 * 16  # five codes a byte (52 bytes a row), an fp16 scale per group of 128
    four_bit = 4 * 256 * 4 + 4 * 2 * 2 * 16  # an fp16 scale and minimum per group
    assert packed["0"] == -(-(ternary + four_bit + 40 + 40 * 16) // 8)  # a bit a row, the fp16 bias
    layer(torch.randn(3, 256)).sum().backward()
    widths = layer.parametrizations.weight[0]
    assert all(p.grad is not None for p in (layer.parametrizations.weight.original, widths.scale, widths.wide_scale))
    with pytest.raises(SystemExit):
        from byte_comparison import parse_args

        parse_args(["--runs", "rows-5-0.1"])


def test_the_ends_arm_widens_the_first_and_last_linear_and_counts_them_as_the_library_stores_them(tmp_path):
    assert ends_arm("ends-8-4") == (8, 4, "none", "ternary")
    assert ends_arm("ends-8-4-hadamard") == (8, 4, "hadamard", "ternary")
    assert ends_arm("ends-8-4-randomized-hadamard") == (8, 4, "randomized-hadamard", "ternary")
    assert ends_arm("ends-8-4-1-hadamard") == (8, 4, "hadamard", 1) and ends_arm("ends-4-4-2") == (4, 4, "none", 2)
    assert ends_arm("ends-8-4-3-hadamard") == (8, 4, "hadamard", 3)
    for refused in ("ends-ternary-4", "ends-5-4", "ends-8-4-rotated", "ends-8-4-8", "ends-8-4-hadamard-1"):
        assert ends_arm(refused) is None, refused
    model = PatchTSTForPrediction(
        tiny_patchtst_config(context_length=128, patch_length=24, patch_stride=24, d_model=128)
    )
    prepare_ends(8, 4)(model, None)
    layers = [module for module in model.modules() if isinstance(module, LowBitLinear)]
    first, last = model.model.encoder.embedder.input_embedding, model.head.projection
    assert (first.bits, last.bits) == (8, 4) and {layer.bits for layer in layers[1:-1]} == {"ternary"}
    assert all(layer.learned_scales and layer.half_bias and layer.group_size == 128 for layer in layers)
    eight = 128 * 24 * 8 + 128 * 2 * 16  # an fp16 scale and minimum per row of 24 (one group)
    assert last.in_features % 128 == 0  # the head's inputs: every patch's 128 features, in groups of 128
    four = last.out_features * (last.in_features * 4 + last.in_features // 128 * 2 * 16)
    assert first.storage_bits() == eight + 128 * 16 and last.storage_bits() == four + last.out_features * 16
    model.save_pretrained(tmp_path)
    assert torch.equal(load_file(tmp_path / "model.safetensors")["head.projection.bias"], last.bias.half())
    with pytest.raises(SystemExit):
        from byte_comparison import parse_args

        parse_args(["--runs", "ends-16-4"])


def test_the_hadamard_ends_arm_rotates_every_linear_but_the_embedding_at_one_bit_an_input():
    config = tiny_patchtst_config(context_length=128, patch_length=24, patch_stride=24, d_model=128, ffn_dim=256)
    plain, rotated = PatchTSTForPrediction(config), PatchTSTForPrediction(config)
    prepare_ends(8, 4)(plain, None)
    prepare_ends(8, 4, "hadamard")(rotated, None)
    layers = {name: m for name, m in rotated.named_modules() if isinstance(m, LowBitLinear)}
    embedding = "model.encoder.embedder.input_embedding"
    assert {name for name, layer in layers.items() if layer.rotation is None} == {embedding}
    assert {layer.rotation.block for name, layer in layers.items() if name != embedding} == {128}
    bits = {name: m.storage_bits() for name, m in plain.named_modules() if isinstance(m, LowBitLinear)}
    assert {name: layer.storage_bits() - bits[name] for name, layer in layers.items()} == {
        name: layer.in_features if layer.rotation else 0 for name, layer in layers.items()
    }  # the stored signs: one bit an input


def test_the_ends_arm_takes_its_middle_width_and_stores_it_in_fewer_bytes():
    """``ends-8-4-1-hadamard``: the embedding at 8 bits, the head at 4, every other Linear at one bit, rotated as the
    ternary middle is; it stores fewer bytes than the ternary middle, the ends unchanged."""
    config = tiny_patchtst_config(context_length=128, patch_length=24, patch_stride=24, d_model=128, ffn_dim=256)
    ternary, one_bit = PatchTSTForPrediction(config), PatchTSTForPrediction(config)
    prepare_ends(8, 4, "hadamard")(ternary, None)
    prepare_ends(*ends_arm("ends-8-4-1-hadamard"))(one_bit, None)
    layers = [m for m in one_bit.modules() if isinstance(m, LowBitLinear)]
    assert (layers[0].bits, layers[-1].bits) == (8, 4) and {layer.bits for layer in layers[1:-1]} == {1}
    assert all(layer.rotation is not None for layer in layers[1:])
    bits = [(a.storage_bits(), b.storage_bits()) for a, b in zip(ternary.modules(), one_bit.modules())
            if isinstance(b, LowBitLinear)]  # fmt: skip
    (first_ternary, first_one_bit), (last_ternary, last_one_bit) = bits[0], bits[-1]
    assert first_ternary == first_one_bit and last_ternary == last_one_bit
    assert all(one < three for three, one in bits[1:-1])


def test_a_narrower_model_rotates_in_the_largest_blocks_its_inputs_allow():
    """d_model 80 cannot rotate in blocks of 128: its Linears rotate in 16 (80 inputs) and 64 (an FFN of 320), and
    the ``-hadamard`` lowbit arm rotates every Linear but the embedding as the ends arm does."""
    assert [rotation_block(n) for n in (128, 512, 80, 320, 24, 1920)] == [128, 128, 16, 64, 8, 128]
    config = tiny_patchtst_config(context_length=128, patch_length=24, patch_stride=24, d_model=80, ffn_dim=320)
    ends, lowbit = PatchTSTForPrediction(config), PatchTSTForPrediction(config)
    prepare_ends(8, 4, "hadamard")(ends, None)
    prepare_lowbit(1, 128, "learned", "float16", "hadamard")(lowbit, None)
    embedding = "model.encoder.embedder.input_embedding"
    for model in (ends, lowbit):
        layers = {name: m for name, m in model.named_modules() if isinstance(m, LowBitLinear)}
        assert layers[embedding].rotation is None
        blocks = {layer.in_features: layer.rotation.block for name, layer in layers.items() if name != embedding}
        assert blocks == {n: rotation_block(n) for n in blocks} and {80, 320} <= set(blocks)
    assert {m.bits for m in lowbit.modules() if isinstance(m, LowBitLinear)} == {1}
    unrotated = PatchTSTForPrediction(config)
    prepare_lowbit(1, 128, "learned", "float16")(unrotated, None)
    assert all(m.rotation is None for m in unrotated.modules() if isinstance(m, LowBitLinear))


def test_the_vq_arm_stores_runs_of_weights_as_codebook_entries_and_trains_both():
    assert vq_arm("vq-4-6") == (4, 6) and vq_arm("vq-3-6") is vq_arm("vq-4-13") is vq_arm("vq-4-0") is None
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    before = layer.weight.detach().clone()
    packed = prepare_vq(4, 6)(torch.nn.Sequential(layer), None)
    weight = layer.weight.detach()
    latent = layer.parametrizations.weight.original.detach()
    runs = weight / latent.pow(2).mean(1, keepdim=True).sqrt().half().float()  # over the row's RMS: entries
    assert len(torch.unique(runs.reshape(-1, 4).half(), dim=0)) <= 64 < len(torch.unique(before.reshape(-1, 4), dim=0))
    assert (weight - before).pow(2).mean() < 0.2 * before.pow(2).mean()  # nearest entries, not any 64
    assert torch.equal(layer.bias, layer.bias.half().float())
    indices, codebook, scales, bias = 48 * 16 * 6, 64 * 4 * 16, 48 * 16, 48 * 16
    assert packed["0"] == (indices + codebook + scales + bias) // 8
    layer(torch.randn(3, 64)).sum().backward()
    assert layer.parametrizations.weight.original.grad.abs().sum() > 0  # straight-through to the fp32 latent
    assert layer.parametrizations.weight[0].codebook.grad.abs().sum() > 0  # the codebook learns
    with pytest.raises(ValueError, match="not a whole number of runs"):
        prepare_vq(8, 6)(torch.nn.Sequential(torch.nn.Linear(12, 4)), None)
    with pytest.raises(SystemExit):
        from byte_comparison import parse_args

        parse_args(["--runs", "vq-3-6"])


def test_naive_forecasts():
    past = torch.arange(12.0).reshape(1, 12, 1)
    assert naive_forecast("last-value", past, 3, 4).flatten().tolist() == [11.0, 11.0, 11.0]
    assert naive_forecast("last-season", past, 6, 4).flatten().tolist() == [8.0, 9.0, 10.0, 11.0, 8.0, 9.0]
    assert naive_forecast("training-mean", past, 2, 4).abs().sum() == 0
    windows = [{"past_values": past[0], "future_values": torch.tensor([[8.0], [9.0], [10.0], [11.0]])}]
    scores = evaluate_naive(windows, [4, 3], batch_size=1)
    assert set(scores) == {"training-mean", "last-value", "last-season-4", "last-season-3"}
    assert scores["last-season-4"]["mse"] == 0 and scores["last-value"]["mse"] == pytest.approx((9 + 4 + 1) / 4)
    assert scores["last-season-3"]["mse"] == pytest.approx(7 / 4)  # 9, 10, 11, 9 against 8, 9, 10, 11


@pytest.mark.parametrize(
    "freq,context,seasons",
    [("h", 336, [24, 168]), ("10min", 336, [144]), ("h", 96, [24]), ("D", 336, [7]), ("7h", 336, [24])],
)
def test_natural_seasons_are_a_day_and_a_week_the_context_holds(freq, context, seasons):
    stamps = pd.Series(pd.date_range("2024-01-01", periods=50, freq=freq).astype(str))
    assert natural_seasons(stamps, context) == seasons


def test_against_naive_says_which_naive_forecast_dense_is_measured_against():
    from byte_comparison import against_naive

    naive = {"last-value": {"mse": 0.8}, "last-season-24": {"mse": 0.05}}
    assert "(last-season-24) 0.0500: dense worse by 100.0 %" in against_naive({"dense": {"mean": 0.1}}, naive)[0]
    assert "dense better by 50.0 %" in against_naive({"dense": {"mean": 0.025}}, naive)[0]


def test_a_csv_of_the_users_own_writes_its_runs_under_the_output_folder_not_onto_the_file(tmp_path):
    from byte_comparison import dataset_folder

    csv = tmp_path / "data" / "hourly_sf_traffic.csv.gz"
    out = tmp_path / "out"
    for dataset, folder in ((str(csv), "hourly_sf_traffic"), ("electricity", "electricity"), ("data/x.csv", "x")):
        assert dataset_folder(dataset) == folder
        assert (out / dataset_folder(dataset)).parent == out


def test_two_csvs_of_one_name_are_refused_before_their_runs_share_a_folder(capsys):
    from byte_comparison import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--datasets", "a/prices.csv", "b/prices.csv"])
    assert "same folder ['prices']" in capsys.readouterr().err
    assert parse_args(["--datasets", "a/prices.csv", "electricity"]).datasets == ["a/prices.csv", "electricity"]


def test_comparison_checks_targets_only_within_the_budget():
    """byte_comparison's table: sample std over the seeds, and no target claimed for a search over its budget."""
    from byte_comparison import markdown, summary

    def run(name, mse, ratio, seed=0):
        return {"name": name, "seed": seed, "metrics": {"mse": mse}, "linear_bytes": {"disk_ratio": ratio}}

    arms = summary([run("dense", 1.0, 1.0), run("dense", 3.0, 1.0, 1), run("smartformer-bytes", 2.0, 0.05)])
    assert arms["dense"]["seeds"] == [0, 1]
    assert arms["dense"]["std"] == pytest.approx(2**0.5) and arms["dense"]["median"] == 2.0
    result = {"d": {"arms": arms, "naive": {"last-value": {"mse": 0.5}}}}
    text = markdown(result, 1 / 16)
    assert "over 2 seeds: sample std, ddof=1" in text and "naive: last-value" in text and "+0.00 %" in text
    over = summary([run("dense", 1.0, 1.0), run("smartformer-bytes", 1.0, 0.5)])
    assert "no target is met" in markdown({"d": {"arms": over, "naive": {}}}, 1 / 16)
    assert "over 1 seeds" in markdown({"d": {"arms": over, "naive": {}}}, 1 / 16)


def test_merge_keeps_each_arm_and_seed_once_and_refuses_mixed_settings():
    """Runs split over processes: a dense run trained in two of them counts once; every random draw counts."""
    from byte_comparison import merged

    def recipe(runs, steps=700):
        return {
            "steps": steps,
            "batch_size": 64,
            "train_stride": 1,
            "budget_ratio": 0.0625,
            "naive": {"last-value": {"mse": 2.0}},
            "runs": [
                {"name": name, "seed": seed, "metrics": {"mse": mse}, "linear_bytes": {"disk_ratio": 1.0}}
                for name, seed, mse in runs
            ],
        }

    first = recipe([("dense", 0, 1.0), ("qat-int2-all", 0, 1.1)])
    second = recipe([("dense", 0, 1.5), ("random-bytes", 0, 2.0), ("random-bytes", 0, 3.0)])
    arms = merged([first, second])["arms"]
    assert arms["dense"]["per_seed"] == [1.0] and arms["random-bytes"]["per_seed"] == [2.0, 3.0]
    with pytest.raises(ValueError, match="differ in"):
        merged([first, recipe([("dense", 1, 1.0)], steps=500)])


def test_the_arm_chosen_on_validation_takes_each_seeds_best_validated_run_and_its_test_mse():
    """Per seed, the arm of least validation MSE, scored on its test MSE: never chosen by the test windows."""
    from byte_comparison import CHOSEN, choice_lines, merged

    def run(name, seed, validation, test):
        return {
            "name": name,
            "seed": seed,
            "metrics": {"mse": test},
            "validation_mse": validation,
            "linear_bytes": {"disk_ratio": 0.06},
            "train_seconds": 10.0,
        }

    runs = [
        run("dense", 0, 0.1, 1.0),
        run("dense", 1, 0.1, 1.0),
        run("ends-8-4", 0, 0.2, 1.5),  # validates better, tests worse: still the one chosen
        run("smartformer-bytes", 0, 0.3, 1.1),
        run("ends-8-4", 1, 0.4, 1.2),
        run("smartformer-bytes", 1, 0.3, 1.4),
        run("ends-8-4", 2, 0.1, 1.0),  # its other arm never ran: no choice for seed 2
    ]
    recipe = {"steps": 10, "budget_ratio": 0.0625, "naive": {}, "runs": runs}
    arms = merged([recipe], ["ends-8-4", "smartformer-bytes"])["arms"]
    assert arms[CHOSEN]["per_seed"] == [1.5, 1.4] and arms[CHOSEN]["seeds"] == [0, 1]
    assert arms[CHOSEN]["chosen"] == ["ends-8-4", "smartformer-bytes"]
    assert CHOSEN not in merged([recipe])["arms"]  # only where asked for
    lines = choice_lines(arms, 1 / 16)
    assert "chose ends-8-4 (seed 0), smartformer-bytes (seed 1)" in lines[0]
    assert "mean +45.00 %" in lines[1]
    runs[3]["validation_mse"] = None
    with pytest.raises(ValueError, match="recorded no validation MSE"):
        merged([recipe], ["ends-8-4", "smartformer-bytes"])


def test_choose_on_validation_needs_two_arms_of_the_run(capsys):
    from byte_comparison import parse_args

    for flags, message in (
        (["--choose-on-validation", "ends-8-4"], "two or more arms"),
        (["--choose-on-validation", "ends-8-4", "random-bytes"], "several draws a seed"),
        (["--runs", "dense", "ends-8-4", "--choose-on-validation", "ends-8-4", "smartformer-bytes"], "not in --runs"),
    ):
        with pytest.raises(SystemExit):
            parse_args(flags)
        assert message in capsys.readouterr().err
    chosen = ["--runs", "ends-8-4", "smartformer-bytes", "--choose-on-validation", "ends-8-4", "smartformer-bytes"]
    assert parse_args(chosen).choose_on_validation == ["ends-8-4", "smartformer-bytes"]


def test_a_learning_rate_sweep_keeps_each_arm_and_seeds_best_validated_rate_and_refuses_an_uneven_sweep():
    """Each (arm, seed) keeps the rate of least validation MSE, whatever the test MSE says; an arm short of a rate of
    the sweep, or a run without model selection, is refused rather than compared."""
    from byte_comparison import learning_rate_lines, markdown, merged

    def recipe(rate, runs):
        return {
            "steps": 10,
            "budget_ratio": 0.0625,
            "learning_rate": rate,
            "naive": {},
            "runs": [
                {"name": n, "seed": s, "metrics": {"mse": t}, "validation_mse": v, "linear_bytes": {"disk_ratio": 1.0}}
                for n, s, v, t in runs
            ],
        }

    low = recipe(1e-3, [("dense", 0, 0.2, 1.0), ("dense", 1, 0.1, 1.3), ("ends-8-4", 0, 0.3, 1.2)])
    high = recipe(4e-3, [("dense", 0, 0.1, 1.4), ("dense", 1, 0.2, 0.9), ("ends-8-4", 0, 0.2, 1.1)])
    result = merged([low, high])
    assert result["arms"]["dense"]["per_seed"] == [1.4, 1.3]  # validated better, tested worse: still kept
    assert result["arms"]["dense"]["learning_rates"] == [4e-3, 1e-3]
    assert result["arms"]["ends-8-4"]["per_seed"] == [1.1]
    assert result["learning_rates_swept"] == [1e-3, 4e-3]
    assert learning_rate_lines(result) == [
        "learning rate kept on validation per seed, of 0.001, 0.004: dense 0.004, 0.001; ends-8-4 0.004"
    ]
    assert "learning rate kept" in markdown({"electricity": result}, 1 / 16)
    single = merged([low])
    assert "learning_rates_swept" not in single and learning_rate_lines(single) == []
    assert single["arms"]["dense"]["per_seed"] == [1.0, 1.3]
    with pytest.raises(ValueError, match=r"no run at learning rate \[0.004\]"):
        merged([low, recipe(4e-3, [("dense", 0, 0.1, 1.4), ("dense", 1, 0.2, 0.9)])])
    with pytest.raises(ValueError, match="recorded no validation MSE"):
        merged([low, recipe(4e-3, [("dense", 0, None, 1.4), ("dense", 1, 0.2, 0.9), ("ends-8-4", 0, 0.2, 1.1)])])
    with pytest.raises(ValueError, match="record no learning rate"):
        merged([low, {**high, "learning_rate": None}])
    with pytest.raises(ValueError, match="random-bytes"):
        merged([recipe(1e-3, [("random-bytes", 0, 0.1, 1.0)]), recipe(4e-3, [("random-bytes", 0, 0.1, 1.0)])])


def test_model_flops_counts_the_products_of_packed_layers_the_fused_kernels_take():
    """Evaluated without gradients, a 3-bit Linear multiplies through the library's fused CPU kernel, which torch's
    FLOP counter cannot see: counted with torch's products instead, the model costs what its dense twin does (the
    same shapes, the same multiply-adds), not less."""
    config = tiny_patchtst_config(context_length=128, patch_length=24, patch_stride=24, d_model=128, ffn_dim=256)
    dense, packed = PatchTSTForPrediction(config), PatchTSTForPrediction(config)
    prepare_ends(*ends_arm("ends-8-4-3"))(packed, None)
    window = [{"past_values": torch.randn(128, config.num_input_channels),
               "future_values": torch.randn(config.prediction_length, config.num_input_channels)}]  # fmt: skip
    assert model_flops(packed, window) == model_flops(dense, window) > 0


def test_the_recipes_take_the_searches_exploration(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    flags = ["--budget-ratio", "1/16", "--forms", "lowbit"]
    default = search_factory(MEDIUM, smartformer.parse_args(flags))(0, in_bytes=True)
    assert (default.epsilon_start, default.epsilon_end, default.epsilon_decay) == (0.5, 0.02, 0.85)  # SearchConfig's
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--help"])
    assert "default 0.5 0.02 0.85)" in " ".join(capsys.readouterr().out.split())
    args = smartformer.parse_args([*flags, "--search-epsilon", "0.6", "0.1", "0.97"])
    for config in (search_factory(MEDIUM, args)(0, in_bytes=True), search_factory(MEDIUM, args)(0)):
        assert (config.epsilon_start, config.epsilon_end, config.epsilon_decay) == (0.6, 0.1, 0.97)
        assert config.epsilon(10) == pytest.approx(max(0.1, 0.6 * 0.97**10))
    for wrong, said in ((["1.5", "0.1", "0.9"], "'1.5': a number in [0, 1]"), (["0.1", "0.5", "0.9"], "exceeds START")):
        with pytest.raises(SystemExit):
            smartformer.parse_args(["--search-epsilon", *wrong])
        assert said in capsys.readouterr().err
    assert passed(comparison_args(["--search-epsilon", "0.6", "0.1", "0.97"])) == [
        "--search-epsilon",
        "0.6",
        "0.1",
        "0.97",
    ]


def test_the_recipes_take_the_searches_agent_learning_rate(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    flags = ["--budget-ratio", "1/16", "--forms", "lowbit"]
    assert search_factory(MEDIUM, smartformer.parse_args(flags))(0, in_bytes=True).learning_rate == 1e-3  # the paper's
    args = smartformer.parse_args([*flags, "--search-agent-lr", "0.01"])
    for config in (search_factory(MEDIUM, args)(0, in_bytes=True), search_factory(MEDIUM, args)(0)):
        assert config.learning_rate == 0.01
    for wrong in ("0", "-1e-3", "fast"):
        with pytest.raises(SystemExit):
            smartformer.parse_args([f"--search-agent-lr={wrong}"])
        assert f"{wrong!r}: a number > 0" in capsys.readouterr().err
    assert passed(comparison_args(["--search-agent-lr", "0.01"])) == ["--search-agent-lr", "0.01"]


def test_the_recipes_take_the_searches_policy(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    flags = ["--budget-ratio", "1/16", "--forms", "lowbit"]
    assert search_factory(MEDIUM, smartformer.parse_args(flags))(0, in_bytes=True).policy == "argmax"  # the paper's
    args = smartformer.parse_args([*flags, "--search-policy", "sample"])
    assert {search_factory(MEDIUM, args)(0, in_bytes=True).policy, search_factory(MEDIUM, args)(0).policy} == {"sample"}
    with pytest.raises(SystemExit):
        smartformer.parse_args(["--search-policy", "softmax"])
    assert "--search-policy: invalid choice: 'softmax'" in capsys.readouterr().err
    assert passed(comparison_args(["--search-policy", "sample"])) == ["--search-policy", "sample"]


def test_the_recipes_take_the_searches_replay(capsys):
    import smartformer
    from byte_comparison import parse_args as comparison_args
    from byte_comparison import passed

    from recipekit.smartformer_arms import search_factory

    flags = ["--budget-ratio", "1/16", "--forms", "lowbit"]
    assert search_factory(MEDIUM, smartformer.parse_args(flags))(0, in_bytes=True).replay_epochs == 0  # the paper's
    args = smartformer.parse_args([*flags, "--search-replay", "10"])
    assert {
        search_factory(MEDIUM, args)(0, in_bytes=True).replay_epochs,
        search_factory(MEDIUM, args)(0).replay_epochs,
    } == {10}
    for wrong in ("-1", "1.5", "many"):
        with pytest.raises(SystemExit):
            smartformer.parse_args([f"--search-replay={wrong}"])
        assert f"{wrong!r}: a whole number >= 0" in capsys.readouterr().err
    assert passed(comparison_args(["--search-replay", "10"])) == ["--search-replay", "10"]
