"""``method="svd"``: the truncated-SVD baseline ("SVD-Smartformer") for the same projections.

``config.py`` ``SVDConfig`` · ``layer.py`` ``LowRankLinear`` (shipped in checkpoints) · ``apply.py``.
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "SVDConfig": ".config",
    "LowRankLinear": ".layer",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "svd",
        config=f"{__name__}.config:SVDConfig",
        build=f"{__name__}.apply:METHOD",
        description=("each projection's weight kept as a truncated SVD U·Vᵀ, the SVD-Smartformer baseline"),
        example={"rank": 0.5},
    )
)
