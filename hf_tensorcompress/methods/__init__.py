"""Method registry: how each compression method builds its replacement layer from a target module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from ..config import CompressionConfig


@dataclass(frozen=True)
class Method:
    """One compression method.

    ``default_targets(model)`` lists full module names to compress when the config names none;
    ``build(model, name, module, config)`` returns the replacement layer (it must not modify ``model``);
    ``accepts`` are the module types the method can replace; ``keywords`` maps a one-word ``target_modules``
    (e.g. ``"all-linear"``) to a function listing its targets; ``model_options(model, config)`` validates and
    resolves model-level options (recorded in ``compression_config``) without touching the model.
    """

    name: str
    default_targets: Callable[[nn.Module], list[str]]
    build: Callable[[nn.Module, str, nn.Module, CompressionConfig], nn.Module]
    accepts: tuple[type[nn.Module], ...] = (nn.Linear,)
    keywords: dict[str, Callable[[nn.Module], list[str]]] = field(default_factory=dict)
    model_options: Callable[[nn.Module, CompressionConfig], dict] | None = None


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"no compression method {name!r}; registered: {sorted(METHODS)}")
    return METHODS[name]


from . import biprop, cp, svd  # noqa: E402,F401  (register the built-in methods)
