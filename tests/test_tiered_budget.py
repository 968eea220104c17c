"""``method="tiered"`` with a byte budget (``size_ratio``): within 1 % of the bytes asked for, every stored byte
counted; the widths follow measured sensitivity, not token ids, so a model whose vocabulary is renumbered (rows,
tied head and text permuted together: the same function) compresses to the same bytes, the same rows and the same
loss; the allocation is saved and reloads."""

from __future__ import annotations

import contextlib
import functools
import io

import pytest
import torch
import transformers as T

from hf_tensorcompress import CompressionConfig, apply_compression, apply_tiered
from hf_tensorcompress.loading import load_model

VOCAB, HIDDEN = 1000, 64
GENERATOR = torch.Generator().manual_seed(2)
#: Zipf-like text: low ids frequent, as in a BPE vocabulary; the permutation below scatters them.
CALIBRATION = (torch.rand(3000, generator=GENERATOR) ** 3 * VOCAB).long()
EVALUATION = (torch.rand(1, 256, generator=GENERATOR) ** 3 * VOCAB).long()
PERMUTATION = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))  # new token i is old PERMUTATION[i]
RENUMBER = torch.argsort(PERMUTATION)  # old id -> new id


def tiny(permuted: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = T.LlamaForCausalLM(config).eval()
    if permuted:
        with torch.no_grad():
            embedding = model.get_input_embeddings().weight
            embedding.copy_(embedding[PERMUTATION])
        for settings in (model.config, model.generation_config):  # its start and end tokens renumbered with it
            settings.bos_token_id, settings.eos_token_id = int(RENUMBER[1]), int(RENUMBER[2])
    return model


def loss(model: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def budget(ratio: float, **options) -> CompressionConfig:
    return CompressionConfig(method="tiered", size_ratio=ratio, rounding="output", codebook_size=256, **options)


@pytest.fixture(scope="module")
def budgeted():
    """``budgeted(ratio)``: the tiny model compressed to that byte budget and what compressing it printed (each
    ratio built once; the tests only read the model)."""

    @functools.cache
    def build(ratio: float) -> tuple[torch.nn.Module, str]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            model = apply_tiered(tiny(), budget(ratio), CALIBRATION, 256)
        return model, printed.getvalue()

    return build


@pytest.mark.parametrize("ratio", [4, 5])
def test_the_budget_is_met_and_renumbering_the_vocabulary_changes_nothing(ratio, budgeted):
    original, printed = budgeted(ratio)
    permuted = apply_tiered(tiny(permuted=True), budget(ratio), RENUMBER[CALIBRATION], 256)
    a, b = original.get_input_embeddings(), permuted.get_input_embeddings()
    stored = a.storage_bits() / 8
    assert abs(VOCAB * HIDDEN * 2 / stored - ratio) / ratio < 0.01
    assert "size_ratio allocation" in printed and f"{int(stored):,} bytes stored" in printed
    assert len({tier["bits"] for tier in a.tier_specs}) > 1  # rows got different widths
    assert b.storage_bits() == a.storage_bits() and b.tier_specs == a.tier_specs
    torch.testing.assert_close(b.weight, a.weight[PERMUTATION], atol=0, rtol=0)
    assert loss(permuted, RENUMBER[EVALUATION]) == pytest.approx(loss(original, EVALUATION), rel=1e-5)


def test_codebook_rows_are_stored_once_and_are_what_storing_them_again_gives(budgeted, monkeypatch):
    """A codebook's rows are kept as measured, not rounded again for the layer: the same layer, bit for bit, as a
    build that stores each chosen row afresh, with every codebook rounding inside the measuring step."""
    import dataclasses

    from hf_tensorcompress.methods.tiered import budget as budget_module
    from hf_tensorcompress.methods.tiered import budget_tiers

    kept, printed = budgeted(5)
    assert "codebook" in printed  # the tiny model's 5× allocation has codebook rows
    measure, rounding = budget_tiers.measure_widths, budget_module.codebook_codes
    calls = []

    def counted(*args, **kwargs):
        calls.append(measuring[0])
        return rounding(*args, **kwargs)

    def measured(*args, forget: bool, **kwargs):
        measuring[0] = True
        widths = measure(*args, **kwargs)
        measuring[0] = False
        return [dataclasses.replace(width, rows=None) for width in widths] if forget else widths

    measuring = [False]
    monkeypatch.setattr(budget_module, "codebook_codes", counted)
    monkeypatch.setattr(budget_tiers, "measure_widths", functools.partial(measured, forget=False))
    with contextlib.redirect_stdout(io.StringIO()):
        again = apply_tiered(tiny(), budget(5), CALIBRATION, 256)
    assert calls and all(calls)  # every codebook rounding while measuring
    calls.clear()
    monkeypatch.setattr(budget_tiers, "measure_widths", functools.partial(measured, forget=True))
    with contextlib.redirect_stdout(io.StringIO()):
        afresh = apply_tiered(tiny(), budget(5), CALIBRATION, 256)
    assert not all(calls)  # without the kept rows, the layer's codebook rows are rounded again
    for model in (again, afresh):
        expected = kept.get_input_embeddings().state_dict()
        state = model.get_input_embeddings().state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[key], expected[key]) for key in state)


def test_the_fixed_token_id_order_does_depend_on_the_numbering():
    """What the docs say of ``tier_order="token_id"``: the same option keeps other tokens wide after renumbering."""
    options = dict(tier_tokens=[200], tier_bits=[8, 2], rounding="output")
    original = apply_tiered(tiny(), CompressionConfig(method="tiered", **options), CALIBRATION, 256)
    permuted = apply_tiered(tiny(True), CompressionConfig(method="tiered", **options), RENUMBER[CALIBRATION], 256)
    rows = original.get_input_embeddings().weight[PERMUTATION]
    assert not torch.allclose(permuted.get_input_embeddings().weight, rows)


def test_frequent_tokens_get_the_wider_rows(budgeted):
    layer = budgeted(4)[0].get_input_embeddings()
    counts = torch.bincount(CALIBRATION, minlength=VOCAB).float()
    widest, narrowest = layer.tier_specs[0], layer.tier_specs[-1]
    order = torch.argsort(layer.slot.long())  # row -> token
    assert counts[order[: widest["rows"]]].mean() > 3 * counts[order[-narrowest["rows"] :]].mean()


def test_the_allocation_is_saved_and_reloads_to_the_same_logits(budgeted, tmp_path):
    model = budgeted(4)[0]
    model.save_pretrained(tmp_path)
    recorded = model.config.compression_config
    assert recorded["size_ratio"] == 4 and recorded["modules"]["model.embed_tokens"]["tiers"]
    loaded = load_model(tmp_path).eval()
    assert loaded.get_input_embeddings().tier_specs == model.get_input_embeddings().tier_specs
    with torch.no_grad():
        assert torch.equal(loaded(EVALUATION).logits, model(EVALUATION).logits)
    native = T.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(native(EVALUATION).logits, model(EVALUATION).logits)


def test_a_budget_needs_calibration_text_and_says_how_to_give_it():
    with pytest.raises(ValueError, match=r"size_ratio.*apply_tiered\(model, config, calibration_ids\)"):
        apply_compression(tiny(), budget(4))


def test_a_budget_below_the_narrowest_rows_names_the_largest_ratio_there():
    with pytest.raises(ValueError, match=r"at most size_ratio=\d"):
        apply_tiered(tiny(), budget(12), CALIBRATION, 256)


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(size_ratio=1), "a number > 1"),
        (dict(size_ratio="4"), "a number > 1"),
        (dict(size_ratio=4, tier_bits=[4]), "leave tier_tokens, tier_bits and low_rank unset"),
        (dict(size_ratio=4, tier_tokens=[10], tier_bits=[4, 3]), "leave tier_tokens"),
        (dict(size_ratio=4, tier_group_size=[64]), "one int"),
    ],
)
def test_bad_budget_options_name_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        CompressionConfig(method="tiered", **options)


@pytest.mark.parametrize("most", [1000, 40])  # a permutation of every vector's index, and a drawn sample
def test_the_codebook_sample_is_a_subset_of_the_scaled_vectors_whatever_the_row_order(most):
    from hf_tensorcompress.methods.tiered.budget import codebook_vectors

    weight = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    scale = weight.pow(2).mean(1, keepdim=True).sqrt()
    sample = codebook_vectors(weight, scale, 4, most)
    every = {tuple(v.tolist()) for v in (weight / scale).reshape(-1, 4)}
    assert 0.9 * min(most, 256) <= len(sample) <= min(most, 256) and {tuple(v.tolist()) for v in sample} <= every
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    again = codebook_vectors(weight[order], scale[order], 4, most)
    assert sorted(map(tuple, sample.tolist())) == sorted(map(tuple, again.tolist()))
