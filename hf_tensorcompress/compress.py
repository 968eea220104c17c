"""``apply_compression(model, config)``: swap target modules for compressed layers, in place, all or nothing."""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import PretrainedConfig

from .config import CompressionConfig, as_config
from .core.export import mark_compressed
from .core.float32_build import float32_on_cpu, module_dtypes
from .core.progress import progress
from .core.registry import get_method, method_for, records
from .core.targets import match_targets
from .runtime.contract import CompressedLayer
from .runtime.modeling_tensorcompress import is_compressed
from .runtime.structure import bind_layers, install_model_options
from .saving import save_extras
from .stacking import adopted_torchao, attach, release_gguf


def resolve_targets(model: nn.Module, config: CompressionConfig) -> list[str]:
    """Full names of the modules ``config`` compresses in ``model``; errors name what would match."""
    method = method_for(config)
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


def compressed_layers(model: nn.Module) -> list[str]:
    """Names of ``model``'s compressed layers, whichever copy of the layer code defined them (this package's, or
    the one ``trust_remote_code`` loaded from a checkpoint): a layer is known by its contract, not its class object."""
    return [
        name
        for name, module in model.named_modules()
        if any(cls.__name__ == CompressedLayer.__name__ for cls in type(module).__mro__)
    ]


def check_not_compressed(model: nn.Module) -> None:
    """Refuse a model that is compressed already, whatever its class object (e.g. a class from
    ``transformers_modules`` after ``trust_remote_code=True``): its config records the compression, or its modules
    are compressed layers. Re-compressing would mix two records of the structure in one checkpoint."""
    recorded = getattr(getattr(model, "config", None), "compression_config", None)
    layers = compressed_layers(model)
    if is_compressed(model) or recorded or layers:
        method = recorded.get("method", "?") if isinstance(recorded, dict) else "?"
        count = len(recorded.get("modules", {})) if isinstance(recorded, dict) else len(layers)
        raise ValueError(
            f"{type(model).__name__} is already compressed (method {method!r}, {count} modules); apply_compression "
            "starts from a dense model: load the dense checkpoint and compress it with one config whose "
            "target_modules lists every module to compress (see docs/guide/errors.md)"
        )


def check_model(model: nn.Module) -> None:
    """A transformers model: compression is recorded in its config, and its class becomes ``Compressed<Class>``."""
    if not isinstance(getattr(model, "config", None), PretrainedConfig) or not hasattr(model, "save_pretrained"):
        raise TypeError(
            f"apply_compression compresses transformers models (a PreTrainedModel with a config to record the "
            f"compression in); {type(model).__name__} is not one. Load the model with its transformers class, or "
            "build the compressed layers yourself (e.g. CPLinear, LowRankLinear)"
        )


def check_ranks(config: CompressionConfig, names: list[str]) -> None:
    """Every per-module rank override must name a compressed module (a typo would silently keep the default)."""
    unused = [key for key in getattr(config, "ranks", {}) if not any(n == key or n.endswith("." + key) for n in names)]
    if unused:
        raise ValueError(f"ranks keys {unused} match no compressed module; the targets are {names[:6]}")


def check_weights_loaded(model: nn.Module, config: CompressionConfig, names: list[str]) -> None:
    """Methods that compute layers from the dense weights need them: a model on the meta device has none."""
    method = method_for(config)
    on_meta = [n for n in names if any(p.is_meta for p in model.get_submodule(n).parameters(recurse=False))]
    if on_meta and method.reads_weights(config):
        random = " or pass init='random'," if hasattr(config, "init") else ""
        raise ValueError(
            f"{on_meta[0]} and the other targets are on the meta device (no weights loaded), but method "
            f"{config.method!r} computes the compressed layers from the dense weights. Load the weights first,{random} "
            f"or compress while loading: {type(model).__name__}.from_pretrained(path, quantization_config=config)"
        )


#: Values ``all_finite`` checks at a time.
FINITE_CHUNK = 1 << 22


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite, ``FINITE_CHUNK`` values at a time: ``torch.isfinite`` takes ``|x|`` as a
    full-size copy beside its masks, which on a 262,144 × 640 fp32 embedding peaks at 1.1 GB."""
    flat = tensor.detach().reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(FINITE_CHUNK))


def check_finite(model: nn.Module, config: CompressionConfig, names: list[str]) -> None:
    """A method that computes its layers from the dense weights needs finite ones: a NaN or infinity would stop a
    decomposition without naming the module, or be stored and give NaN outputs. Checked before anything changes."""
    if not method_for(config).reads_weights(config):
        return
    for name in names:
        for key, tensor in model.get_submodule(name).named_parameters(recurse=False):
            if tensor.is_meta or not tensor.is_floating_point() or all_finite(tensor):
                continue
            nan, infinite = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
            first = [int(i) for i in torch.nonzero(~torch.isfinite(tensor))[0]]
            raise ValueError(
                f"{name}.{key} holds {nan} NaN and {infinite} infinite value(s) (the first at index {first}); "
                f"{config.method!r} computes its compressed layer from these weights, so nothing was compressed. "
                "Compress the model before the values went bad (a diverged training, a broken conversion), or fix "
                "them first"
            )


def own_config(model: nn.Module) -> None:
    """Give ``model`` its own copy of its config (and of the sub-configs its modules hold), so that recording the
    compression does not change another model built from the same config object."""
    memo: dict[int, object] = {}
    copied = copy.deepcopy(model.config, memo)
    for module in model.modules():
        shared = getattr(module, "config", None)
        if isinstance(shared, PretrainedConfig) and id(shared) in memo:
            module.config = memo[id(shared)]
    model.config = copied


def apply_compression(
    model: nn.Module, config: CompressionConfig | dict | str, calibration: object | None = None
) -> nn.Module:
    """Compress ``model`` in place and return it (same object, still an instance of its transformers class).

    Every replacement layer is built before any is installed, so an error leaves the model untouched (its state
    dict, class and config). The model gets its own copy of its config first, so a config object shared with other
    models is left as it was.
    The resolved per-module specs are recorded in ``config.compression_config`` and the class becomes
    ``Compressed<Class>`` so that ``save_pretrained`` writes the self-contained modeling code. ``calibration`` is
    data a method needs beyond the weights (tt: ``TTCalibration``; see ``apply_tt``). ``config`` may also be a dict
    or its JSON text (read by ``CompressionConfig.from_dict``). A model that is compressed already is refused; one
    loaded with ``TorchAoConfig`` keeps its quantized Linears, recorded beside the compression (``stacking``).
    With ``calibration`` the build may run the model; on CPU an fp16 model, and a bf16 one where the CPU lacks bf16
    units, then runs in float32 while it builds (``core.float32_build``: several times faster there) and keeps its
    dtypes after.
    """
    check_not_compressed(model)
    check_model(model)
    config = as_config(config)
    method = method_for(config)
    names = resolve_targets(model, config)
    linears = adopted_torchao(model, names)
    check_ranks(config, names)
    check_weights_loaded(model, config, names)
    check_finite(model, config, names)
    options = method.model_options(model, config) if method.model_options else {}
    runs_model = calibration is not None  # a calibrated build may run the model: on CPU in float32 where faster
    with float32_on_cpu(model, enabled=runs_model):
        prepared = method.prepare(model, config, calibration) if method.prepare else None
        layers = {
            name: method.build(model, name, model.get_submodule(name), config, prepared)
            for name in progress(names, desc=f"compress ({config.method})", unit="module")
        }
    if runs_model:  # each layer in the dtype of the module it replaces, as a half-precision build would leave it
        for name, dtype in module_dtypes(model, names).items():
            layers[name] = layers[name].to(dtype)
    own_config(model)
    release_gguf(model)
    for name, layer in layers.items():
        # transformers' "initialised" flag, so initialize_weights() leaves the layer as built; on the meta device
        # there is nothing built yet: initialize_weights() after to_empty() gives the layer its init
        layer._is_hf_initialized = not any(t.is_meta for t in layer.state_dict().values())
        layer.train(model.get_submodule(name).training)  # built in training mode: it takes the replaced module's
        model.set_submodule(name, layer)
    bind_layers(model, layers)
    specs = {name: layer.spec() for name, layer in layers.items()}
    recorded = type(config).from_dict({**config.to_dict(), **options, "modules": specs})
    mark_compressed(model, recorded.to_dict(), save_hook=save_extras)
    install_model_options(model, model.config.compression_config)
    if linears is not None:
        attach(model, linears)
    return model


def refresh_compression_config(model: nn.Module) -> None:
    """Re-record every module spec after ranks changed (e.g. by the rank search), so saving stays consistent."""
    recorded = model.config.compression_config
    recorded["modules"] = {name: model.get_submodule(name).spec() for name in recorded["modules"]}


def apply_calibrated(
    model: nn.Module,
    config: CompressionConfig | dict | str,
    calibration_ids: torch.Tensor | None = None,
    covariance_tokens: int = 4096,
) -> nn.Module:
    """``apply_compression`` with calibration text, as token ids, for the methods that use it (``Method.calibrate``:
    tt's output basis and exact tokens, tiered's token order and output-aware rounding). The text must not overlap
    the evaluation text; the hidden-state covariance is measured on its first ``covariance_tokens``. What the
    calibration decides ends up in the checkpoint: loading needs none. Without ids, ``apply_compression``."""
    config = as_config(config)
    if calibration_ids is None:
        return apply_compression(model, config)
    method = method_for(config)
    if method.calibrate is None:
        takes = [name for name in records() if get_method(name).calibrate is not None]
        raise ValueError(f"method {config.method!r} takes no calibration text ({', '.join(takes)} do)")
    with float32_on_cpu(model):  # the calibration pass runs the model: on CPU in float32 where faster
        calibration = method.calibrate(model, config, calibration_ids, covariance_tokens)
    return apply_compression(model, config, calibration=calibration)


#: The calibrated entry points under the names the methods' documentation uses.
apply_tt = apply_tiered = apply_calibrated
