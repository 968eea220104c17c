"""``method="tt"``: TensorSLM tensor-train token embeddings (training-free).

``config.py`` ``TTConfig`` · ``layer.py`` ``TTEmbedding`` / ``TTTiedHead`` (shipped in checkpoints) · ``apply.py``
(``apply_tt``) · ``calibration.py`` (output-aware basis, exact tokens) · ``healing.py`` (optional distillation) ·
``energy.py`` (the paper's η and energy model, the matrix-SVD baseline).
"""

from .config import TTConfig
from .layer import TTEmbedding, TTTiedHead

__all__ = ["TTConfig", "TTEmbedding", "TTTiedHead"]
