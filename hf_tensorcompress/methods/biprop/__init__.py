"""``method="biprop"``: Sparse Binary Transformers (Biprop masks; Step-T and Q/K/V attention options).

``config.py`` ``BipropConfig`` · ``layer.py`` ``BipropLinear`` and ``attention.py`` (both shipped in checkpoints) ·
``apply.py`` (targets, the attention option, ``apply_attention`` for a dense baseline with the same attention).
"""


_EXPORTS = {
    "BipropConfig": ".config",
    "BipropLinear": ".layer",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    """Exports load on first use, so importing the config (e.g. for ``--help``) does not import torch."""
    import importlib

    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
