"""``method="tt"``: TensorSLM tensor-train token embeddings (training-free).

``config.py`` ``TTConfig`` · ``layer.py`` ``TTEmbedding`` / ``TTTiedHead`` (shipped in checkpoints) · ``apply.py``
(``apply_tt``) · ``calibration.py`` (output-aware basis, exact tokens) · ``healing.py`` (optional distillation) ·
``energy.py`` (the paper's η and energy model, the matrix-SVD baseline) · ``baselines.py`` (frequency-only and
dense rows + SVD tail at a parameter budget).
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "TTConfig": ".config",
    "TTEmbedding": ".layer",
    "TTTiedHead": ".head",
    "TTCalibration": ".calibration",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "tt",
        config=f"{__name__}.config:TTConfig",
        build=f"{__name__}.apply:METHOD",
        description=("each token's embedding vector kept as a tensor train (matrix product state), TensorSLM"),
        example={"tt_ranks": 8},
    )
)
