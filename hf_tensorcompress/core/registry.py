"""The method registry: each compression method registers its config class and how it builds its layers.

Methods register themselves when their ``methods/<name>/apply.py`` is imported (it calls ``register_method``);
lookups load the built-in ones on first use, so importing this module imports no method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

#: ``build(model, name, module, config, calibration) -> layer``: must not modify ``model``.
Builder = Callable[[nn.Module, str, nn.Module, Any, Any], nn.Module]


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
    a model whose weights are on the meta device, i.e. not loaded).
    """

    name: str
    config_class: type
    default_targets: Callable[[nn.Module], list[str]]
    build: Builder
    accepts: tuple[type[nn.Module], ...] = (nn.Linear,)
    keywords: dict[str, Callable[[nn.Module], list[str]]] = field(default_factory=dict)
    model_options: Callable[[nn.Module, Any], dict] | None = None
    prepare: Callable[[nn.Module, Any, Any], Any] | None = None
    reads_weights: Callable[[Any], bool] = lambda config: True


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` under its name (a second registration of the same name replaces the first)."""
    _METHODS[method.name] = method
    return method


def registered_methods() -> dict[str, Method]:
    """Every registered method by name (the built-in ones are imported on first call)."""
    from ..methods import load_builtin

    load_builtin()
    return dict(_METHODS)


def get_method(name: str) -> Method:
    """The method called ``name``; an error lists the registered ones."""
    methods = registered_methods()
    if name not in methods:
        raise ValueError(f"method={name!r} is not supported; choose one of {sorted(methods)}")
    return methods[name]
