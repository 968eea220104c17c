"""The compression methods, one package each: ``config.py`` (its options), ``layer.py`` (the replacement layer,
shipped inside checkpoints) and ``apply.py`` (how the layer is built from a target module; its one
``register_method`` call registers the method).

A folder here with an ``apply.py`` is a built-in method: ``load_builtin`` finds and imports them when a method is
first looked up, so importing a layer never pulls in the application code. Methods defined elsewhere register
with ``hf_tensorcompress.register_method`` and are looked up the same way.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from ..core.registry import Method, registered


def builtin_names() -> list[str]:
    """The method folders of this package (those with an ``apply.py``)."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if info.ispkg and (Path(__path__[0]) / info.name / "apply.py").is_file()
    )


def load_builtin() -> None:
    """Register the built-in methods (importing ``methods/<name>/apply.py`` registers ``<name>``)."""
    for name in builtin_names():
        importlib.import_module(f"{__name__}.{name}.apply")


def registered_methods() -> dict[str, Method]:
    """Every registered method by name, the built-in ones included."""
    load_builtin()
    return registered()


def get_method(name: str) -> Method:
    """The method called ``name``; an error lists the registered ones."""
    methods = registered_methods()
    if name not in methods:
        raise ValueError(f"method={name!r} is not supported; choose one of {sorted(methods)}")
    return methods[name]


def methods_table() -> str:
    """The documentation's table of methods, made from the registry (a test keeps the docs equal to it)."""
    rows = ["| method | config | layers (in checkpoints) | replaces |", "|---|---|---|---|"]
    for name, method in sorted(registered_methods().items()):
        layers = ", ".join(f"`{cls.__name__}`" for cls in method.layers)
        accepts = ", ".join(f"`{cls.__name__}`" for cls in method.accepts)
        rows.append(f"| `{name}` | `{method.config_class.__name__}` | {layers} | {accepts} |")
    return "\n".join(rows)
