"""One call builds every linear method on the meta device (as transformers builds models): ``init="random"`` is
cp's and svd's way to need no weights, and biprop accepts it (its layers are always drawn from their seeds); the
model's own init path then fills every compressed tensor."""

from __future__ import annotations

import pytest
import torch
from transformers import PatchTSTForPrediction

from hf_tensorcompress import CompressionConfig, apply_compression
from helpers import tiny_patchtst_config


@pytest.mark.parametrize("method", ["cp", "svd", "biprop"])
def test_init_random_builds_every_linear_method_on_the_meta_device(method):
    with torch.device("meta"):
        model = PatchTSTForPrediction(tiny_patchtst_config())
    apply_compression(model, CompressionConfig(method=method, init="random"))
    model.to_empty(device="cpu")
    model.initialize_weights()
    for name in model.config.compression_config["modules"]:
        tensors = model.get_submodule(name).state_dict().values()
        assert all(torch.isfinite(t.float()).all() for t in tensors), name
    assert torch.isfinite(model(past_values=torch.randn(2, 32, 3)).prediction_outputs).all()


def test_biprop_refuses_decompose_saying_why():
    with pytest.raises(ValueError, match="drawn from their seed.*no dense weights to decompose"):
        CompressionConfig(method="biprop", init="decompose")
