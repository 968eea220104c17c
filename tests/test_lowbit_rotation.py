"""``method="lowbit"`` with ``input_rotation="hadamard"`` / ``"randomized-hadamard"``: the inputs rotated by stored
signs (all +1, or random) and a Hadamard matrix, the weight held in the rotated basis; the same outputs once loaded
or decompressed (exported: ``onnx_cases.py``), and a checkpoint whose spec lost or changed the option refused rather
than read in the wrong basis."""

from __future__ import annotations

import copy
import json
import logging
import shutil

import pytest
import torch
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression, decompress
from hf_tensorcompress.deploy.onnx.linears import walsh_hadamard
from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from hf_tensorcompress.methods.lowbit.rotation import InputRotation, sylvester
from hf_tensorcompress.runtime.structure import CompressedCheckpointError
from tests.helpers import tiny_patchtst_config

ROTATED = dict(
    method="lowbit", weight_bits="ternary", weight_group_size=16, input_rotation="hadamard", rotation_block=16
)


def test_the_hadamard_matrix_is_orthogonal_and_symmetric_and_the_graph_butterflies_equal_it():
    matrix = sylvester(64)
    assert torch.allclose(matrix @ matrix, torch.eye(64), atol=1e-6) and torch.equal(matrix, matrix.T)
    x = torch.randn(3, 5, 128)
    assert torch.allclose(walsh_hadamard(x, 64), (x.unflatten(-1, (-1, 64)) @ matrix).flatten(-2), atol=1e-5)
    for size in (0, 1, 96):
        with pytest.raises(ValueError, match="power of two"):
            sylvester(size)


def test_rotate_and_unrotate_are_inverse_and_the_signs_are_drawn_from_their_seed_and_stored():
    rotation = InputRotation(32, 16, seed=0)
    state = torch.random.get_rng_state()
    rotation.draw()
    assert torch.equal(torch.random.get_rng_state(), state)  # torch's own generator is left alone
    signs = rotation.sign_values(torch.float32)
    assert rotation.signs.dtype == torch.uint8 and rotation.signs.shape == (2, 2)  # one bit an input, a row a block
    assert set(signs.tolist()) == {-1.0, 1.0}
    again, other, fixed = InputRotation(32, 16, seed=0), InputRotation(32, 16, seed=1), InputRotation(32, 16)
    again.draw(), other.draw(), fixed.draw()
    assert torch.equal(again.signs, rotation.signs) and not torch.equal(other.signs, rotation.signs)
    assert torch.equal(fixed.sign_values(torch.float32), torch.ones(32))  # unrandomized: Sylvester's matrix alone
    weight = torch.randn(8, 32)
    assert torch.allclose(rotation.unrotate(rotation.rotate(weight)), weight, atol=1e-5)
    x = torch.randn(5, 32)
    assert torch.allclose(rotation(x) @ rotation.rotate(weight).T, x @ weight.T, atol=1e-5)  # the same outputs


def test_a_rotated_layer_computes_its_dense_weight_and_spreads_an_outlier_input_over_its_groups():
    """One input 30× the others: plain ternary groups round around it and lose the rest of their columns; rotated,
    every group holds a share of it, and the layer's error against the dense product falls."""
    torch.manual_seed(0)
    dense = torch.nn.Linear(64, 32)
    with torch.no_grad():
        dense.weight[:, 5] *= 30
    errors = {}
    for block in (None, 64):
        layer = LowBitLinear(64, 32, "ternary", 64, rotation_block=block)
        with torch.no_grad():
            layer.latent.copy_(dense.weight if block is None else layer.rotation.rotate(dense.weight))
            layer.bias.copy_(dense.bias)
        x = torch.randn(200, 64)
        with torch.no_grad():
            out = layer(x)
            assert torch.allclose(out, x @ layer.dense_weight().T + layer.bias, atol=1e-4)
            errors[block] = ((out - dense(x)).norm() / dense(x).norm()).item()
    assert errors[64] < 0.8 * errors[None], errors


@pytest.mark.parametrize("rotation", ["hadamard", "randomized-hadamard"])
def test_saved_loaded_decompressed_and_counted_with_its_sign_bits(tmp_path, rotation):
    torch.manual_seed(0)
    config = CompressionConfig(**{**ROTATED, "input_rotation": rotation})
    model = apply_compression(PatchTSTForPrediction(tiny_patchtst_config()), config).eval()
    layers = [module for module in model.modules() if isinstance(module, LowBitLinear)]
    rotated = [layer for layer in layers if layer.rotation is not None]
    assert rotated and len(rotated) < len(layers)  # the 8-input patch embedding is left as it is
    plain = LowBitLinear(32, 32, "ternary", 16)
    assert rotated[0].storage_bits() - plain.storage_bits() == 32  # one bit an input, nothing more
    x = torch.randn(2, 32, 3)
    with torch.no_grad():
        expected = model(past_values=x).prediction_outputs
    model.save_pretrained(tmp_path)
    spec = json.loads((tmp_path / "config.json").read_text())["compression_config"]["modules"]
    assert {name: entry.get("rotation_block") for name, entry in spec.items()} == {
        name: None if model.get_submodule(name).rotation is None else 16 for name in spec
    }
    loaded = PatchTSTForPrediction.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(past_values=x).prediction_outputs, expected, atol=1e-6)
        dense = decompress(copy.deepcopy(loaded))
        assert type(dense) is PatchTSTForPrediction
        assert torch.allclose(dense(past_values=x).prediction_outputs, expected, atol=1e-5)


def _edited_spec(folder, name: str, edit) -> None:
    """Apply ``edit`` to module ``name``'s spec in the saved config.json."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config["compression_config"]["modules"][name])
    path.write_text(json.dumps(config))


def test_a_checkpoint_whose_spec_lost_or_changed_the_block_is_refused_not_read_in_another_basis(tmp_path):
    torch.manual_seed(0)
    model = apply_compression(PatchTSTForPrediction(tiny_patchtst_config()), CompressionConfig(**ROTATED))
    model.save_pretrained(tmp_path / "saved")
    name = next(name for name, module in model.named_modules() if getattr(module, "rotation", None) is not None)
    edits = {
        f"extra '{name}.rotation.signs'": lambda spec: spec.pop("rotation_block"),
        "has shape": lambda spec: spec.update(rotation_block=32),
    }
    for index, (refusal, edit) in enumerate(edits.items()):
        folder = shutil.copytree(tmp_path / "saved", tmp_path / str(index))
        _edited_spec(folder, name, edit)
        with pytest.raises(CompressedCheckpointError, match=refusal):
            PatchTSTForPrediction.from_pretrained(folder)


def test_padding_bits_past_the_inputs_are_refused():
    rotation = InputRotation(12, 4)
    rotation.draw()
    rotation.check_state()
    with torch.no_grad():
        rotation.signs[-1, 0] |= 1  # the last bit of the last block's byte: 4 past its 4 inputs
    with pytest.raises(Exception, match="padding"):
        rotation.check_state()


def test_the_options_are_checked_and_an_unrotatable_linear_is_named(caplog):
    for bad, match in (
        ({"input_rotation": "random"}, "input_rotation"),
        ({"rotation_block": 96}, "power of two"),
        ({"rotation_seed": -1}, "rotation_seed"),
    ):
        with pytest.raises(ValueError, match=match):
            CompressionConfig(**{**ROTATED, **bad})
    with caplog.at_level(logging.WARNING):
        apply_compression(PatchTSTForPrediction(tiny_patchtst_config()), CompressionConfig(**ROTATED))
    assert "model.encoder.embedder.input_embedding has 8 inputs, not a multiple of rotation_block=16" in caplog.text
