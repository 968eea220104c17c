"""``apply_compression(model, config)``: swap target modules for compressed layers, in place, all or nothing."""

from __future__ import annotations

from tqdm.auto import tqdm
from torch import nn

from .config import CompressionConfig
from .core.export import mark_compressed
from .core.modeling_tensorcompress import CompressedModelMixin
from .core.registry import get_method
from .core.structure import bind_layers, install_model_options
from .core.targets import match_targets


def resolve_targets(model: nn.Module, config: CompressionConfig) -> list[str]:
    """Full names of the modules ``config`` compresses in ``model``; errors name what would match."""
    method = get_method(config.method)
    if config.target_modules is None:
        names = method.default_targets(model)
    elif isinstance(config.target_modules, str) and config.target_modules in method.keywords:
        names = method.keywords[config.target_modules](model)
    else:
        names = match_targets(model, config.target_modules)
    if not names:
        candidates = [name for name, module in model.named_modules() if isinstance(module, method.accepts)][:8]
        raise ValueError(
            f"target_modules={config.target_modules!r} matches no module of {type(model).__name__}; "
            f"modules {method.name!r} can compress look like: {candidates}"
        )
    wrong = [name for name in names if not isinstance(model.get_submodule(name), method.accepts)]
    if wrong:
        kinds = ", ".join(t.__name__ for t in method.accepts)
        raise ValueError(
            f"method {method.name!r} replaces {kinds} modules, but target_modules also matched {wrong[:4]} "
            f"({type(model.get_submodule(wrong[0])).__name__}); narrow target_modules"
        )
    return names


def apply_compression(model: nn.Module, config: CompressionConfig, calibration: object | None = None) -> nn.Module:
    """Compress ``model`` in place and return it (same object, still an instance of its transformers class).

    Every replacement layer is built before any is installed, so an error leaves the model untouched.
    The resolved per-module specs are recorded in ``config.compression_config`` and the class becomes
    ``Compressed<Class>`` so that ``save_pretrained`` writes the self-contained modeling code. ``calibration`` is
    data a method needs beyond the weights (tt: ``TTCalibration``; see ``apply_tt``).
    """
    if isinstance(model, CompressedModelMixin):
        raise ValueError(
            f"{type(model).__name__} is already compressed ({model.config.compression_config['method']}); "
            "start from the dense model to compress it differently"
        )
    config.validate()
    method = get_method(config.method)
    names = resolve_targets(model, config)
    options = method.model_options(model, config) if method.model_options else {}
    prepared = method.prepare(model, config, calibration) if method.prepare else None
    layers = {
        name: method.build(model, name, model.get_submodule(name), config, prepared)
        for name in tqdm(names, desc=f"compress ({config.method})", disable=len(names) < 8)
    }
    for name, layer in layers.items():
        model.set_submodule(name, layer)
    bind_layers(model, layers)
    specs = {n: l.spec() for n, l in layers.items()}
    recorded = type(config).from_dict({**config.to_dict(), **options, "modules": specs})
    mark_compressed(model, recorded)
    install_model_options(model, model.config.compression_config)
    return model


def refresh_compression_config(model: nn.Module) -> None:
    """Re-record every module spec after ranks changed (e.g. by the rank search), so saving stays consistent."""
    recorded = model.config.compression_config
    recorded["modules"] = {name: model.get_submodule(name).spec() for name in recorded["modules"]}
