"""``method="cp"``: Smartformer's CP-decomposed attention projections.

``config.py`` ``CPConfig`` · ``layer.py`` ``CPLinear`` (shipped in checkpoints) · ``apply.py`` building it from a
dense projection (tensorly CP-ALS of the folded weight).
"""

from ...lazy import lazy_exports

_EXPORTS = {
    "CPConfig": ".config",
    "CPLinear": ".layer",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
