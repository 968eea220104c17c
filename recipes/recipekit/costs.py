"""Cost accounting of a recipe's runs: parameters, FLOPs and bytes of the attention projections and every Linear."""

from __future__ import annotations

import os
from unittest.mock import patch

import torch
from torch.utils.flop_counter import FlopCounterMode

from hf_tensorcompress import compression_report
from hf_tensorcompress.core.metrics import linear_bytes, linear_modules
from hf_tensorcompress.core.targets import attention_projections, family_of
from hf_tensorcompress.training.forecasting import point_forecast_for_training

#: The counts a run's ``linear_bytes`` / ``attention_bytes`` keep of ``core.metrics.linear_bytes``.
BYTE_KEYS = ("dense", "disk", "ram", "disk_ratio", "ram_ratio")


def qkv_names(model: torch.nn.Module) -> list[str]:
    """The q/k/v projections of the family's attention modules, whatever replaced them (dense, compressed, quantized)."""
    family = family_of(model)
    return [
        f"{name}.{projection}"
        for name, module in model.named_modules()
        if type(module).__name__ in family.attention_classes
        for projection in family.projections
        if hasattr(module, projection)
    ]


def scope_names(model: torch.nn.Module, scope: str) -> list[str]:
    """The Linear layers an arm quantizes or factorizes: ``qkv`` (the attention projections) or ``all``."""
    return attention_projections(model) if scope == "qkv" else list(linear_modules(model))


def attention_params(model: torch.nn.Module) -> int:
    """Parameters of the attention q/k/v projections (dense Linear or their compressed replacement)."""
    return sum(p.numel() for name in qkv_names(model) for p in model.get_submodule(name).parameters())


def projection_flops(model: torch.nn.Module) -> int:
    """FLOPs of the q/k/v projections for one token (a multiply-add counts 2), at the path each layer takes."""
    compressed = {}
    if getattr(model.config, "compression_config", None):
        compressed = {row["name"]: row["flops"] for row in compression_report(model, tokens=1)["modules"]}
    return sum(
        compressed[name]
        if name in compressed
        else 2 * model.get_submodule(name).in_features * model.get_submodule(name).out_features
        for name in qkv_names(model)
    )


def model_flops(model: torch.nn.Module, windows) -> int:
    """FLOPs of one forward of the whole model on one window (counted by torch, so every layer is in it: embedding,
    attention, feed-forward, head; the training-mode forward, teacher-forced for Autoformer/Informer)."""
    device = next(model.parameters()).device  # the windows stay on the CPU; the model may be on a GPU
    batch = {key: value.unsqueeze(0).to(device) for key, value in windows[0].items() if isinstance(value, torch.Tensor)}
    was_training = model.training
    model.eval()
    # the library's fused CPU kernels off for the count: torch's counter cannot see their products and would count
    # them as none; torch's decoded product is the same multiply-adds
    kernels_off = patch.dict(os.environ, {"HF_TENSORCOMPRESS_KERNELS": "0"})
    with torch.no_grad(), kernels_off, FlopCounterMode(display=False) as counter:
        point_forecast_for_training(model, batch)
    model.train(was_training)
    return int(counter.get_total_flops())


def every_linear_bytes(model: torch.nn.Module, packed: dict[str, int] | None = None) -> dict:
    """Bytes of every Linear layer on disk and in RAM, and their fractions of fp32 (``packed``: the disk bytes of
    modules deployed in another form than they trained in)."""
    counted = linear_bytes(model, packed)
    return {key: counted[key] for key in BYTE_KEYS}


def byte_counts(model: torch.nn.Module, packed: dict[str, int] | None = None) -> dict:
    """Bytes of every Linear layer and of the q/k/v projections, on disk and in RAM, and their fractions of fp32."""
    counted = linear_bytes(model, packed)
    qkv = [counted["modules"][name] for name in qkv_names(model)]
    attention = {key: sum(row[key] for row in qkv) for key in ("dense", "disk", "ram")}
    return {
        "linear_bytes": {key: counted[key] for key in BYTE_KEYS},
        "attention_bytes": {
            **attention,
            "disk_ratio": attention["disk"] / attention["dense"],
            "ram_ratio": attention["ram"] / attention["dense"],
        },
    }


def bytes_cell(counts: dict, where: str) -> str:
    """``"12,345 (0.250×)"``: the bytes ``where`` (``disk`` / ``ram``) and their fraction of fp32, for a table."""
    return f"{counts[where]:,} ({counts[where + '_ratio']:.3f}×)"
