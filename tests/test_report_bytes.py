"""``compression_report`` counts what a checkpoint holds: the whole model's bytes on disk equal its safetensors
tensors', the compressed modules' their tensors', parameters those of the model, a tied head's FLOPs included."""

from __future__ import annotations

import pytest
import torch
from journey_steps import CASES, build
from safetensors import safe_open

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report, quantize_linears
from hf_tensorcompress.runtime.contract import SIGNPOST_KEY, TOMBSTONE_KEY


def saved_tensor_bytes(folder) -> dict[str, int]:
    """Bytes of every tensor in the checkpoint's safetensors files, tombstones and the signpost left out."""
    sizes = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        for key in handle.keys():
            tensor = handle.get_tensor(key)
            if key == SIGNPOST_KEY or (key.endswith("." + TOMBSTONE_KEY) and tensor.dim() == 0):
                continue
            sizes[key] = tensor.numel() * tensor.element_size()
    return sizes


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_bytes_equal_the_checkpoint_and_parameters_the_model(case, tmp_path):
    spec = CASES[case]
    model = build(spec["family"])
    dense_params = sum(p.numel() for p in model.parameters())
    apply_compression(model, CompressionConfig(**spec["config"]))
    if spec.get("torchao"):
        from torchao.quantization import IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerAxis
        from transformers import TorchAoConfig

        quantize_linears(model, TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))))
    model.save_pretrained(tmp_path)
    report = compression_report(model, tokens=4)
    saved = saved_tensor_bytes(tmp_path)
    modules = tuple(f"{name}." for name in model.config.compression_config["modules"])
    assert report["bytes"]["model"]["disk"] == sum(saved.values())
    assert report["bytes"]["targets"]["disk"] == sum(size for key, size in saved.items() if key.startswith(modules))
    assert report["model"]["dense_params"] == dense_params
    if spec["family"] == "llama":  # the tied head reads the compressed table: its FLOPs are the dense head's
        head = next(row for row in report["modules"] if row["type"] == "tied_head")
        assert head["flops"] == head["dense_flops"] == 2 * 4 * 256 * 64
