"""Export forms of the compressed token embeddings and their tied heads (filled in with the causal-LM export)."""

from __future__ import annotations

from torch import nn


def swap_embeddings(model: nn.Module) -> list[str]:
    """Replace compressed embeddings (and the tied head reading them) by their export forms; the replaced names."""
    return []
