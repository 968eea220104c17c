"""``method="svd"``: the truncated-SVD baseline ("SVD-Smartformer") for the same projections.

``config.py`` ``SVDConfig`` · ``layer.py`` ``LowRankLinear`` (shipped in checkpoints) · ``apply.py``.
"""

from ...lazy import lazy_exports

_EXPORTS = {
    "SVDConfig": ".config",
    "LowRankLinear": ".layer",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
