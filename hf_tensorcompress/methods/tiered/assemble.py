"""Putting a built tiered layer together (build time only; not shipped): its class, and its token→row map."""

from __future__ import annotations

import torch

from .layer import TieredEmbedding
from .scaled import ScaledTieredEmbedding


def layer_class(scale: float | None) -> type[TieredEmbedding]:
    """``TieredEmbedding``, or ``ScaledTieredEmbedding`` for an embedding that multiplies its rows by ``scale``."""
    return TieredEmbedding if scale is None else ScaledTieredEmbedding


def with_slots(layer: TieredEmbedding, order: torch.Tensor) -> TieredEmbedding:
    """``order[i]`` is the token stored in row ``i``; the layer's ``slot`` maps tokens back to rows."""
    slot = torch.empty(len(order), dtype=torch.int32, device=order.device)
    slot[order] = torch.arange(len(order), dtype=torch.int32, device=order.device)
    layer.slot.copy_(slot)
    return layer
