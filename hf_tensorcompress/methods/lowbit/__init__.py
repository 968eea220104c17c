"""``method="lowbit"``: full-rank Linear weights stored in 8, 4, 3, 2 bits, ternary or signs with group scales, trained
quantization-aware (straight-through).

``config.py`` ``LowBitConfig`` · ``layer.py`` ``LowBitLinear`` (shipped in checkpoints) · ``apply.py``.
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "LowBitConfig": ".config",
    "LowBitLinear": ".layer",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "lowbit",
        config=f"{__name__}.config:LowBitConfig",
        build=f"{__name__}.apply:METHOD",
        description=(
            "every Linear's full weight in 8, 4, 3, 2 bits, ternary or signs with a scale per group, trained "
            "quantization-aware and saved packed"
        ),
        example={"bits": 4, "group_size": 8},
    )
)
