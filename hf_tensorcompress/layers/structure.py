"""Rebuilds a compressed model's structure from the per-module specs recorded in ``config.compression_config``.

Ships inside saved checkpoints: imports torch and its siblings only. Every replacement layer type is listed in
``LAYER_TYPES`` and offers ``spec()`` / ``from_spec(spec)``.
"""

from __future__ import annotations

from torch import nn

from .attention import install_attention
from .biprop import BipropLinear
from .cp import CPLinear
from .lowrank import LowRankLinear

LAYER_TYPES: dict[str, type[nn.Module]] = {cls.layer_type: cls for cls in (CPLinear, LowRankLinear, BipropLinear)}


class CompressedCheckpointError(ValueError):
    """A checkpoint's structure or tensors do not match its ``compression_config``."""


def build_layer(spec: dict) -> nn.Module:
    """An empty layer of the type and shape ``spec`` describes (weights are loaded afterwards)."""
    layer_type = spec.get("type")
    if layer_type not in LAYER_TYPES:
        raise CompressedCheckpointError(
            f"compression_config names layer type {layer_type!r}, which this code does not know; "
            f"known types: {sorted(LAYER_TYPES)}. The checkpoint was written by a newer hf_tensorcompress."
        )
    return LAYER_TYPES[layer_type].from_spec(spec)


def install_layers(model: nn.Module, module_specs: dict[str, dict]) -> None:
    """Swap each recorded module of ``model`` for an empty layer of the recorded type and shape."""
    for name, spec in module_specs.items():
        try:
            old = model.get_submodule(name)
        except AttributeError as error:
            raise CompressedCheckpointError(
                f"compression_config lists module {name!r}, but the model built from config.json has no such "
                f"module; the config does not belong to this architecture."
            ) from error
        layer = build_layer(spec)
        reference = next(old.parameters(), None)
        if reference is not None:
            layer.to(device=reference.device, dtype=reference.dtype)
        model.set_submodule(name, layer)


def install_model_options(model: nn.Module, compression: dict) -> None:
    """Model-level options recorded in ``compression_config`` (biprop's SBT attention), re-installed on load."""
    install_attention(model, compression)
