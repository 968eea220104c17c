"""Rebuilds a compressed model's structure from the per-module specs recorded in ``config.compression_config``.

Ships inside saved checkpoints. It names no method: layer types come from ``CompressedLayer.types`` and
model-level options from ``ModelOption.options``, which the layer files fill when they are imported (in a
checkpoint, by ``shipped_layers``; in the package, when their method registers).
"""

from __future__ import annotations

from torch import nn

from .contract import CompressedLayer, ModelOption
from .shipped_layers import LAYER_CLASSES  # noqa: F401  (in a checkpoint: imports, so registers, its layers)


class CompressedCheckpointError(ValueError):
    """A checkpoint's structure or tensors do not match its ``compression_config``."""


def build_layer(spec: dict) -> nn.Module:
    """An empty layer of the type and shape ``spec`` describes (weights are loaded afterwards)."""
    if not isinstance(spec, dict):
        raise CompressedCheckpointError(f"a module spec in compression_config must be a dict, got {spec!r}")
    layer_type = spec.get("type")
    if layer_type not in CompressedLayer.types:
        raise CompressedCheckpointError(
            f"compression_config names layer type {layer_type!r}, which this code does not know; "
            f"known types: {sorted(CompressedLayer.types)}. The checkpoint was written by a newer hf_tensorcompress."
        )
    return CompressedLayer.types[layer_type].from_spec(spec)


def build_recorded(name: str, spec: dict) -> nn.Module:
    """``build_layer(spec)`` for module ``name`` of ``compression_config``, with an error naming the module: a spec
    is read from a file, so any failure to build from it (a size of 0, a negative one) is the spec's fault."""
    try:
        return build_layer(spec)
    except Exception as error:
        if isinstance(error, CompressedCheckpointError):
            raise
        raise CompressedCheckpointError(
            f"config.json: compression_config['modules'][{name!r}] is not a valid spec ({type(error).__name__}: "
            f"{error}); restore config.json from the saved checkpoint, or save the compressed model again"
        ) from error


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
        layer = build_recorded(name, spec)
        reference = next(old.parameters(), None)
        if reference is not None:
            layer.to(device=reference.device, dtype=reference.dtype)
        model.set_submodule(name, layer)
    for name in module_specs:  # recorded specs: a field that does not fit the model (tied_output) is the spec's fault
        try:
            bind_layers(model, [name])
        except Exception as error:
            raise CompressedCheckpointError(
                f"config.json: compression_config['modules'][{name!r}] does not fit this model ({type(error).__name__}"
                f": {error}); restore config.json from the saved checkpoint, or save the compressed model again"
            ) from error


def bind_layers(model: nn.Module, names) -> None:
    """Let layers that act beyond their own module finish the job once all are installed (``layer.bind(model)``):
    e.g. a TT embedding installs the tied output head that reads its cores and switches off weight tying."""
    for name in names:
        layer = model.get_submodule(name)
        if isinstance(layer, CompressedLayer):
            layer.bind(model)


def active_options(compression: dict) -> list[type[ModelOption]]:
    """The registered model options ``compression`` turns on."""
    return [option for option in ModelOption.options.values() if option.active(compression)]


def install_model_options(model: nn.Module, compression: dict) -> None:
    """Model-level options recorded in ``compression_config`` (e.g. biprop's SBT attention), re-installed on load."""
    for option in active_options(compression):
        option.install(model, compression)
