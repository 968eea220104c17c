"""``method="tiered"``: the token embedding (and a tied output layer) as tiers of low-bit rows, training-free.

``config.py`` ``TieredConfig`` · ``layer.py`` ``TieredEmbedding`` / ``TieredTiedHead`` (shipped in checkpoints) ·
``rounding.py`` (output-aware GPTQ rounding, low-rank fit) · ``budget.py`` / ``budget_tiers.py`` (``size_ratio``) ·
``model_text.py`` (the model's own text) · ``guard.py`` (protected tokens, the held-back check) · ``apply.py``
(``apply_tiered``).
"""

from ...core.lazy import lazy_exports
from ...core.registry import MethodRecord, register_method

_EXPORTS = {
    "TieredConfig": ".config",
    "TieredEmbedding": ".layer",
    "TieredTiedHead": ".layer",
    "template_tokens": ".guard",
    "BudgetCheckWarning": ".guard",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

register_method(
    MethodRecord(
        "tiered",
        config=f"{__name__}.config:TieredConfig",
        build=f"{__name__}.apply:METHOD",
        description=(
            "the token embedding's rows kept as tiers of packed low-bit codes (int2–int8 with group scales) or "
            "codebook indices, rounded output-aware (GPTQ / GPTVQ) where calibrated; the tied output layer reads "
            "them"
        ),
        example={"tier_tokens": [2000], "tier_bits": [4, 3]},
    )
)
