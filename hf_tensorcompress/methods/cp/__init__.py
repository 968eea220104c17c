"""``method="cp"``: Smartformer's CP-decomposed attention projections.

``config.py`` ``CPConfig`` · ``layer.py`` ``CPLinear`` (shipped in checkpoints) · ``apply.py`` building it from a
dense projection (tensorly CP-ALS of the folded weight).
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "CPConfig": ".config",
    "CPLinear": ".layer",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "cp",
        config=f"{__name__}.config:CPConfig",
        build=f"{__name__}.apply:METHOD",
        description=(
            "each projection's weight folded to heads × head dim × out and kept as rank-R CP factors, "
            "Smartformer's CPAC-Attention"
        ),
        example={"rank": 0.5},
        default=True,
    )
)
