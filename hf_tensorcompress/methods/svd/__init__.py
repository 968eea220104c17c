"""``method="svd"``: the truncated-SVD baseline ("SVD-Smartformer") for the same projections.

``config.py`` ``SVDConfig`` · ``layer.py`` ``LowRankLinear`` (shipped in checkpoints) · ``apply.py``.
"""


_EXPORTS = {
    "SVDConfig": ".config",
    "LowRankLinear": ".layer",
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
