"""Method registry: how each compression method builds its replacement layer from a target module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..config import CompressionConfig


@dataclass(frozen=True)
class Method:
    """One compression method.

    ``default_targets(model)`` lists full module names to compress when the config names none;
    ``build(model, name, module, config)`` returns the replacement layer (it must not modify ``model``);
    ``accepts`` are the module types the method can replace.
    """

    name: str
    default_targets: Callable[[nn.Module], list[str]]
    build: Callable[[nn.Module, str, nn.Module, CompressionConfig], nn.Module]
    accepts: tuple[type[nn.Module], ...] = (nn.Linear,)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"no compression method {name!r}; registered: {sorted(METHODS)}")
    return METHODS[name]


from . import cp, svd, tt  # noqa: E402,F401  (register the built-in methods)
