"""A calibrated build of a bf16 or fp16 model on CPU runs the model in float32 (a bf16 forward is several times slower
on CPUs without bf16 units), a bf16 one in bf16 where the CPU has bf16 units, and leaves the model in its own dtypes:
every weight it did not replace bitwise as it was, a float32 buffer float32, the tied head tied, the new layer in
the replaced one's dtype; a build that fails leaves every tensor as it was."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from unittest import mock

import pytest
import torch
import transformers as T

from hf_tensorcompress import CompressionConfig, apply_tiered
from hf_tensorcompress.core import float32_build
from hf_tensorcompress.core.float32_build import float32_on_cpu
from hf_tensorcompress.methods.tiered.guard import BudgetCheckWarning

VOCAB = 1000
CALIBRATION = (torch.rand(10_000, generator=torch.Generator().manual_seed(0)) ** 3 * VOCAB).long()


def tiny(dtype: torch.dtype) -> torch.nn.Module:
    """A tied Llama in ``dtype`` whose rotary buffer stays float32, as transformers keeps it in a bf16 model."""
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config).eval().to(dtype)
    model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.float()
    return model


def budget() -> CompressionConfig:
    return CompressionConfig(method="tiered", size_ratio=4, codebook_size=256, model_text_tokens=128)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def build_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    """``apply_tiered`` on ``model``; the dtypes its decoder layer was run in while it built."""
    seen: list[torch.dtype] = []
    hook = model.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", BudgetCheckWarning)  # the short text's warning: not what this tests
        apply_tiered(model, budget(), CALIBRATION, 512)
    hook.remove()
    return set(seen)


def bf16_units(present: bool):
    """This CPU with or without bf16 dot-product units, whichever the machine running the test has."""
    return mock.patch("hf_tensorcompress.core.float32_build.native_bf16", return_value=present)


@pytest.mark.parametrize(
    "dtype, units, runs_in",
    [
        (torch.bfloat16, False, torch.float32),
        (torch.float16, False, torch.float32),
        (torch.bfloat16, True, torch.bfloat16),
        (torch.float16, True, torch.float32),
    ],
)
def test_a_half_precision_build_runs_where_the_cpu_is_fast_and_keeps_the_models_dtypes(dtype, units, runs_in):
    model = tiny(dtype)
    before = snapshot(model)
    with bf16_units(units):
        assert build_dtypes(model) == {runs_in}
    after = model.state_dict()
    kept = [name for name in before if not name.startswith(("model.embed_tokens.", "lm_head."))]
    assert kept and all(after[name].dtype == before[name].dtype for name in kept)
    assert all(torch.equal(after[name], before[name]) for name in kept)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.get_input_embeddings().dtype_probe.dtype == dtype
    logits = model(input_ids=CALIBRATION[None, :32]).logits
    assert logits.dtype == dtype and torch.isfinite(logits).all()


def test_a_build_that_fails_leaves_every_tensor_as_it_was():
    model = tiny(torch.bfloat16)
    before = snapshot(model)
    failing = mock.patch("hf_tensorcompress.methods.tiered.apply.budget_tiers", side_effect=RuntimeError("stop"))
    with failing, pytest.raises(RuntimeError, match="stop"), contextlib.redirect_stdout(io.StringIO()):
        apply_tiered(model, budget(), CALIBRATION, 512)
    after = model.state_dict()
    assert set(after) == set(before)
    assert all(after[name].dtype == before[name].dtype and torch.equal(after[name], before[name]) for name in before)
    assert model.lm_head.weight is model.get_input_embeddings().weight


def test_inside_the_build_a_tied_head_stays_tied_and_half_tensors_are_float32():
    model = tiny(torch.bfloat16)
    with bf16_units(False), float32_on_cpu(model):
        assert model.lm_head.weight is model.get_input_embeddings().weight
        assert {t.dtype for t in model.state_dict().values() if t.is_floating_point()} == {torch.float32}
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    with float32_on_cpu(model, enabled=False):
        assert model.get_input_embeddings().weight.dtype == torch.bfloat16


def test_forced_float32_builds_a_bf16_model_in_float32_on_a_cpu_with_bf16_units_and_restores_the_setting():
    model = tiny(torch.bfloat16)
    with bf16_units(True), mock.patch.dict("os.environ", {float32_build.FLOAT32_BUILD: "0"}):
        with float32_build.forced_float32():
            assert build_dtypes(model) == {torch.float32}
        assert os.environ[float32_build.FLOAT32_BUILD] == "0"
        with float32_build.forced_float32(enabled=False):
            assert float32_build.float32_dtypes() == (torch.float16,)
        for value, forced in (("true", True), ("No", False), ("", False)):
            os.environ[float32_build.FLOAT32_BUILD] = value
            assert (float32_build.float32_dtypes() == float32_build.HALF) is forced
