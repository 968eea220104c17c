"""``method="cp"``: Smartformer's CP-decomposed attention projections.

``config.py`` ``CPConfig`` · ``layer.py`` ``CPLinear`` (shipped in checkpoints) · ``apply.py`` building it from a
dense projection (tensorly CP-ALS of the folded weight).
"""

from .config import CPConfig
from .layer import CPLinear

__all__ = ["CPConfig", "CPLinear"]
