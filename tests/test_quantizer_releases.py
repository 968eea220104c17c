"""The quantizer answers transformers' loading calls in the form each supported release makes them: 5.17 (the GPU
machines' release) asks for the weight conversions without the model, 5.25 with it."""

from __future__ import annotations

import pytest
from torch import nn
from transformers.quantizers.base import HfQuantizer

from hf_tensorcompress.quantizer import CompressedCheckpointConfig, TensorCompressQuantizer


class OneArgumentLinears:
    """A Linear-weight quantizer as transformers 5.17 defines it: conversions only."""

    def update_weight_conversions(self, weight_conversions: list) -> list:
        return [*weight_conversions, "linears"]


def one_argument_base(self, weight_conversions: list) -> list:
    return [*weight_conversions, "base"]


def two_argument_base(self, weight_conversions: list, model: nn.Module) -> list:
    return [*weight_conversions, type(model).__name__]


@pytest.mark.parametrize("linears", [False, True], ids=["compressed", "with quantized linears"])
def test_weight_conversions_without_the_model_as_5_17_asks(monkeypatch, linears):
    monkeypatch.setattr(HfQuantizer, "update_weight_conversions", one_argument_base)
    quantizer = TensorCompressQuantizer(CompressedCheckpointConfig(), pre_quantized=True)
    if linears:
        quantizer.linears = OneArgumentLinears()
    assert quantizer.update_weight_conversions(["model's"]) == ["model's", "linears" if linears else "base"]


def test_weight_conversions_with_the_model_as_5_25_asks(monkeypatch):
    monkeypatch.setattr(HfQuantizer, "update_weight_conversions", two_argument_base)
    quantizer = TensorCompressQuantizer(CompressedCheckpointConfig(), pre_quantized=True)
    assert quantizer.update_weight_conversions(["model's"], nn.Linear(2, 2)) == ["model's", "Linear"]
