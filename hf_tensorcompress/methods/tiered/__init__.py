"""``method="tiered"``: the token embedding (and a tied output layer) as tiers of low-bit rows, training-free.

``config.py`` ``TieredConfig`` · ``layer.py`` ``TieredEmbedding`` / ``TieredTiedHead`` (shipped in checkpoints) ·
``rounding.py`` (output-aware GPTQ rounding, low-rank fit) · ``apply.py`` (``apply_tiered``).
"""

from ...lazy import lazy_exports

_EXPORTS = {
    "TieredConfig": ".config",
    "TieredEmbedding": ".layer",
    "TieredTiedHead": ".layer",
    "apply_tiered": ".apply",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
