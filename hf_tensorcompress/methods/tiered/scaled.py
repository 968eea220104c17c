"""Tiered embeddings for models that scale their token embedding in the forward (Gemma, Gemma 2, Gemma 3: ``√d``).

Ships inside saved checkpoints (torch only). The scale is applied exactly as the replaced module applies it
(``lookup * embed_scale`` cast to the output's dtype; an fp32 lookup on CPU takes that product as the C code decodes
each row, not in a second pass); the stored rows, ``weight`` and a tied output layer stay unscaled, as the dense
matrix was.
"""

from __future__ import annotations

import torch

from .layer import TieredEmbedding


class ScaledTieredEmbedding(TieredEmbedding):
    """``TieredEmbedding`` whose lookup is multiplied by a constant ``embed_scale``."""

    layer_type = "tiered_embedding_scaled"

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed_scale = float(embed_scale)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(input_ids, scale=self.embed_scale)

    def spec(self) -> dict:
        return {**super().spec(), "type": self.layer_type, "embed_scale": self.embed_scale}

    @classmethod
    def from_spec(cls, spec: dict) -> ScaledTieredEmbedding:
        layer = super().from_spec(spec)
        layer.embed_scale = float(spec["embed_scale"])
        return layer

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale}"
