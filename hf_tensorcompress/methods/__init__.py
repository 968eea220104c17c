"""The compression methods, one package each: ``config.py`` (its options), ``layer.py`` (the replacement layer,
shipped inside checkpoints) and ``apply.py`` (how the layer is built from a target module; registers the method).

A method package's ``__init__`` exports its config and layer only; ``apply`` modules are imported by
``load_builtin`` when the registry is first asked, so importing a layer never pulls in the application code.
"""

from __future__ import annotations

import importlib

BUILTIN = ("biprop", "cp", "svd", "tt", "tiered")


def load_builtin() -> None:
    """Register the built-in methods (importing ``methods/<name>/apply.py`` registers ``<name>``)."""
    for name in BUILTIN:
        importlib.import_module(f"{__name__}.{name}.apply")
