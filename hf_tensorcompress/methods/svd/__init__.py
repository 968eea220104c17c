"""``method="svd"``: the truncated-SVD baseline ("SVD-Smartformer") for the same projections.

``config.py`` ``SVDConfig`` · ``layer.py`` ``LowRankLinear`` (shipped in checkpoints) · ``apply.py``.
"""

from .config import SVDConfig
from .layer import LowRankLinear

__all__ = ["SVDConfig", "LowRankLinear"]
