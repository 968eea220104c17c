"""``method="biprop"``: Sparse Binary Transformers (Biprop masks; Step-T and Q/K/V attention options).

``config.py`` ``BipropConfig`` · ``layer.py`` ``BipropLinear`` and ``attention.py`` (both shipped in checkpoints) ·
``apply.py`` (targets, the attention option, ``apply_attention`` for a dense baseline with the same attention).
"""

from ...lazy import lazy_exports

_EXPORTS = {
    "BipropConfig": ".config",
    "BipropLinear": ".layer",
    "apply_attention": ".apply",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
