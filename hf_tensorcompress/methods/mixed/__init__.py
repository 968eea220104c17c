"""``method="mixed"``: a form of its own for each target Linear (low-bit, low-rank, CP, Biprop, or a reuse of
another Linear's weights), the byte search's result as a config.

``config.py`` ``MixedConfig`` · ``apply.py`` (builds each Linear with the method its form names; the layers are those
methods', shipped in checkpoints) · ``shared.py`` (``SharedLinear``: a Linear computing with another one's weights).
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {"MixedConfig": ".config"}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "mixed",
        config=f"{__name__}.config:MixedConfig",
        build=f"{__name__}.apply:METHOD",
        description=(
            "each Linear in a form of its own (full weight in a few bits, low-rank or CP factors, a Biprop mask), "
            "as the byte search allocates them"
        ),
        example={
            "forms": {
                "q_proj": {"method": "lowbit", "weight_bits": 4, "weight_group_size": 8},
                "k_proj": {"method": "svd", "rank": 0.5, "factor_bits": 4},
                "v_proj": {"method": "biprop", "keep_ratio": 0.5, "init": "dense", "bias": True},
            }
        },
    )
)
