"""Package exports imported on first use (PEP 562), so importing a package for its config (the command line's
``--help``) does not import torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module relative to ``package``) on first access."""
    module = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(module, name, value)  # later lookups skip this function
        return value

    return __getattr__
