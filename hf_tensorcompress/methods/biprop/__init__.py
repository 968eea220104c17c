"""``method="biprop"``: Sparse Binary Transformers (Biprop masks; Step-T and Q/K/V attention options).

``config.py`` ``BipropConfig`` · ``layer.py`` ``BipropLinear`` and ``attention.py`` (both shipped in checkpoints) ·
``apply.py`` (targets, the attention option, ``apply_attention`` for a dense baseline with the same attention).
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "BipropConfig": ".config",
    "BipropLinear": ".layer",
    "apply_attention": ".apply",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "biprop",
        config=f"{__name__}.config:BipropConfig",
        build=f"{__name__}.apply:METHOD",
        description=(
            "frozen random weights with learned scores choosing a sparse binary mask (sign · α), Sparse Binary "
            "Transformers"
        ),
        example={"keep_ratio": 0.5},
    )
)
