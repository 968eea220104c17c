"""The method registry: each compression method registers its config class, how it builds its layers, and the
layer and model-option classes its checkpoints ship.

A method registers itself with one ``register_method`` call (the built-in ones in ``methods/<name>/apply.py``);
this module knows no method. ``hf_tensorcompress.methods.get_method`` loads the built-in ones before looking up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # no torch at import: the command line reads the registry for its flags
    from torch import nn

#: ``build(model, name, module, config, calibration) -> layer``: must not modify ``model``.
Builder = Callable[["nn.Module", str, "nn.Module", Any, Any], "nn.Module"]


@dataclass(frozen=True)
class Method:
    """One compression method.

    ``config_class`` holds its options (a ``CompressionConfig`` subclass); ``default_targets(model)`` lists full
    module names to compress when the config names none; ``build`` returns the replacement layer; ``accepts`` are
    the module types it can replace; ``keywords`` maps a one-word ``target_modules`` (e.g. ``"all-linear"``) to a
    function listing its targets; ``model_options(model, config)`` validates and resolves model-level options
    (recorded in ``compression_config``) without touching the model; ``prepare(model, config, calibration)``
    checks and condenses calibration data once, before any layer is built (its result reaches every ``build``);
    ``reads_weights(config)`` says whether ``build`` computes the layer from the dense weights (then it cannot run on
    a model whose weights are on the meta device, i.e. not loaded); ``layers`` and ``options`` are the
    ``CompressedLayer`` and ``ModelOption`` classes its checkpoints may name: their files (and what those import
    from the package) ship inside every checkpoint of the method.
    """

    name: str
    config_class: type
    default_targets: Callable[[nn.Module], list[str]]
    build: Builder
    accepts: tuple[type[nn.Module], ...] = ()
    keywords: dict[str, Callable[[nn.Module], list[str]]] = field(default_factory=dict)
    model_options: Callable[[nn.Module, Any], dict] | None = None
    prepare: Callable[[nn.Module, Any, Any], Any] | None = None
    reads_weights: Callable[[Any], bool] = lambda config: True
    layers: tuple[type[nn.Module], ...] = ()
    options: tuple[type, ...] = ()


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method``, keyed by its name, which must be its config class's ``method_name``. A second method of the
    same name is refused (registering the very same ``Method`` again is a no-op)."""
    if getattr(method.config_class, "method_name", None) != method.name:
        raise ValueError(
            f"Method {method.name!r}: its config class {method.config_class.__name__} must set "
            f"method_name = {method.name!r} (the name configs and checkpoints use)"
        )
    if not method.accepts:
        raise ValueError(f"Method {method.name!r} names no module types it replaces (accepts=...)")
    if not method.layers:
        raise ValueError(f"Method {method.name!r} names no layer classes (layers=...): its checkpoints could not load")
    existing = _METHODS.get(method.name)
    if existing is not None and existing != method:
        raise ValueError(f"a method named {method.name!r} is already registered ({existing.config_class.__name__})")
    _METHODS[method.name] = method
    return method


def registered() -> dict[str, Method]:
    """The methods registered so far, by name (built-in ones only once something loaded them)."""
    return dict(_METHODS)
