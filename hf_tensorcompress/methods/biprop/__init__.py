"""``method="biprop"``: Sparse Binary Transformers (Biprop masks; Step-T and Q/K/V attention options).

``config.py`` ``BipropConfig`` · ``layer.py`` ``BipropLinear`` and ``attention.py`` (both shipped in checkpoints) ·
``apply.py`` (targets, the attention option, ``apply_attention`` for a dense baseline with the same attention).
"""

from .config import BipropConfig
from .layer import BipropLinear

__all__ = ["BipropConfig", "BipropLinear"]
