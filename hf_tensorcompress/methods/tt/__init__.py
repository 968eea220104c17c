"""``method="tt"``: TensorSLM tensor-train token embeddings (training-free).

``config.py`` ``TTConfig`` · ``layer.py`` ``TTEmbedding`` / ``TTTiedHead`` (shipped in checkpoints) · ``apply.py``
(``apply_tt``) · ``calibration.py`` (output-aware basis, exact tokens) · ``healing.py`` (optional distillation) ·
``energy.py`` (the paper's η and energy model, the matrix-SVD baseline).
"""


_EXPORTS = {
    "TTConfig": ".config",
    "TTEmbedding": ".layer",
    "TTTiedHead": ".layer",
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
