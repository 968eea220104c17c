"""Hadamard-rotated low-bit forms in the search over forms (``SearchConfig.input_rotations``): offered where the block
divides a Linear's inputs, costed with their sign bits, built and changed like every form, chosen by the uniform
allocation, and saved by a trained search so that the model forecasts the same in new processes."""

from __future__ import annotations

import pytest
import torch
from smartformer_fixtures import assert_forecasts_in_new_processes, dense_patchtst, search_trainer, sines

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import uniform_forms
from hf_tensorcompress.search.form_swap import change_forms, prepare_for_forms
from hf_tensorcompress.search.forms import Form, linear_slots

ROTATED = dict(forms=("dense", "lowbit"), factor_widths=(4, "ternary"), weight_group_sizes=(16,), rotation_block=16)


def rotated_config(budget: float = 1 / 6, **overrides) -> SearchConfig:
    options = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=budget, **ROTATED)
    return SearchConfig(**{**options, "input_rotations": ("none", "hadamard"), **overrides})


def test_rotated_forms_are_offered_where_the_block_divides_the_inputs_and_cost_their_sign_bits():
    model = dense_patchtst(layers=1)
    slots = linear_slots(model, rotated_config())
    for slot in slots:
        lowbit = [form for form in slot.actions if form.kind == "lowbit"]
        rotations = {form.rotation for form in lowbit}
        assert rotations == ({"none"} if slot.in_features % 16 else {"none", "hadamard"}), slot.name
        for form in lowbit:
            assert Form.from_label(form.label()) == form
            if form.rotation == "none":
                continue
            plain = Form("lowbit", form.bits, group=form.group)
            assert slot.bytes_at(form) == slot.bytes_at(plain) + slot.in_features / 8  # one sign bit an input
            options = form.options(slot.factor_group_size, 2, slot.bias_dtype, slot.rotation_block)
            built = apply_compression(
                dense_patchtst(layers=1), CompressionConfig(method="mixed", forms={slot.name: options})
            ).get_submodule(slot.name)
            assert built.rotation is not None and built.rotation.block == 16
            assert slot.bytes_at(form) == built.storage_bits() / 8
    assert any(slot.in_features % 16 for slot in slots)  # the patch embedding (8 inputs) stays unrotated
    assert Form.from_label("lowbit:ternary/g16/learned/randomized-hadamard").scales == "learned"
    for label in ("lowbit:2/g16/hadamard/learned", "lowbit:2/g16/rotated", "lowbit:2/g16/learned/hadamard/x"):
        with pytest.raises(ValueError, match="lowbit:<bits>/<g<group>\\|row>\\[/learned\\]\\[/hadamard"):
            Form.from_label(label)


def test_the_config_refuses_rotations_it_does_not_know_and_blocks_that_are_no_hadamard_size():
    with pytest.raises(ValueError, match="input_rotations=\\['givens'\\]: distinct values among"):
        rotated_config(input_rotations=("givens",))
    with pytest.raises(ValueError, match="input_rotations=\\[\\]"):
        rotated_config(input_rotations=())
    with pytest.raises(ValueError, match="rotation_block=24 must be a power of two"):
        rotated_config(rotation_block=24)
    assert SearchConfig.from_dict(rotated_config().to_dict()).input_rotations == ("none", "hadamard")


def test_a_change_to_a_rotated_form_builds_a_layer_of_the_same_weight_and_a_width_change_keeps_the_rotation():
    model = dense_patchtst(layers=1)
    slot = next(slot for slot in linear_slots(model, rotated_config()) if slot.name.endswith("ff.0"))
    plain, rotated = Form("lowbit", 4, group=16), Form("lowbit", 4, group=16, rotation="hadamard")
    prepare_for_forms(model, [slot])
    change_forms(model, {slot.name: slot}, {slot.name: plain})
    before = model.get_submodule(slot.name)
    change_forms(model, {slot.name: slot}, {slot.name: rotated})
    after = model.get_submodule(slot.name)
    assert after is not before and after.rotation is not None and before.rotation is None
    torch.testing.assert_close(after.latent_weight(), before.latent_weight())  # the same weight, held rotated
    change_forms(model, {slot.name: slot}, {slot.name: Form("lowbit", "ternary", group=16, rotation="hadamard")})
    assert model.get_submodule(slot.name) is after and after.bits == "ternary" and after.rotation is not None
    randomized = Form("lowbit", "ternary", group=16, rotation="randomized-hadamard")
    change_forms(model, {slot.name: slot}, {slot.name: randomized})
    assert model.get_submodule(slot.name) is not after  # another rotation: a new layer
    assert model.get_submodule(slot.name).rotation.seed == 0


def test_the_uniform_allocation_takes_the_offered_scales_and_rotates_every_linear_it_can():
    config = rotated_config(input_rotations=("hadamard",), weight_scales=("learned",))
    slots = linear_slots(dense_patchtst(layers=1), config)
    budget = sum(slot.dense_bytes for slot in slots)
    uniform = uniform_forms(slots, budget, "lowbit")
    assert {(form.bits, form.scales) for form in uniform.values()} == {(4, "learned")}  # the most bytes that fit
    for slot in slots:
        assert uniform[slot.name].rotation == ("none" if slot.in_features % 16 else "hadamard"), slot.name


@pytest.mark.slow
def test_a_search_over_rotated_forms_saves_a_model_that_forecasts_the_same_in_new_processes(tmp_path):
    search = rotated_config(input_rotations=("hadamard",), forms=("lowbit",))
    trainer = search_trainer(tmp_path / "run", search, steps=24)
    trainer.train()
    model = trainer.model
    forms = model.config.compression_config["forms"]
    rotated = [name for name, options in forms.items() if options.get("input_rotation") == "hadamard"]
    assert rotated and all(model.get_submodule(name).rotation is not None for name in rotated)
    model.eval()
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        expected = model(past_values=past).prediction_outputs
    model.save_pretrained(tmp_path / "saved")
    torch.save({"past": past, "expected": expected}, tmp_path / "io.pt")
    assert_forecasts_in_new_processes(tmp_path)
