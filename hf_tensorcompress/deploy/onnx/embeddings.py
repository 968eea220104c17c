"""Export forms of the tiered token embedding and its tied head: every tier keeps its packed codes (or codebook
indices), group scales and codebook as initializers; a lookup gathers the token's packed row and decodes only that
row in the graph (``Gather`` → unpack → scale), and the tied head decodes each tier and multiplies it with the hidden
states, so the one stored table serves both, as in the checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from ...methods.tiered.layer import TieredEmbedding, TieredTiedHead
from .unpack import graph_form


class GraphTiered(nn.Module):
    """``TieredEmbedding`` in graph ops: ``slot[token]`` picks the stored row; each tier decodes the rows its range
    holds (the others read row 0 and are discarded by a ``Where``), plus the low-rank part of the last tier."""

    def __init__(self, layer: TieredEmbedding) -> None:
        super().__init__()
        self.embedding_dim, self.rank = layer.embedding_dim, layer.rank
        self.ranges = layer._ranges()
        self.low_rank_start, self.tier_rows = layer.low_rank_start, [tier["rows"] for tier in layer.tier_specs]
        self.tier_stores = [bool(tier["bits"]) for tier in layer.tier_specs]
        self.register_buffer("slot", layer.slot)
        self.tiers = nn.ModuleList(graph_form(stored) for stored in layer.tiers)
        if layer.rank:
            self.left, self.right = graph_form(layer.left), graph_form(layer.right)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        slot = self.slot[input_ids.reshape(-1)].long()
        vectors = torch.zeros(slot.shape[0], self.embedding_dim)
        for stored, (start, end) in zip(self.tiers, self.ranges):
            inside = (slot >= start) & (slot < end)
            rows = stored.rows(torch.where(inside, slot - start, torch.zeros_like(slot)))
            vectors = torch.where(inside[:, None], rows, vectors)
        if self.rank:
            inside = slot >= self.low_rank_start
            rows = self.left.rows(torch.where(inside, slot - self.low_rank_start, torch.zeros_like(slot)))
            vectors = vectors + torch.where(inside[:, None], rows @ self.right.values(), torch.zeros_like(vectors))
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden @ Wᵀ`` in token order: each tier's decoded rows times the hidden states, concatenated in the
        stored order, then put in token order by ``slot``."""
        stored, scores = iter(self.tiers), []
        for rows, stores in zip(self.tier_rows, self.tier_stores):
            scores.append(hidden @ next(stored).values().T if stores else hidden.new_zeros(*hidden.shape[:-1], rows))
        scores = torch.cat(scores, dim=-1)
        if self.rank:
            low_rank = (hidden @ self.right.values().T) @ self.left.values().T
            scores = torch.cat([scores[..., : self.low_rank_start], scores[..., self.low_rank_start :] + low_rank], -1)
        return scores.index_select(-1, self.slot.long())


class GraphTieredHead(nn.Module):
    """The tied output layer: the embedding's ``logits`` (a reference, not a submodule: one table in the file)."""

    def __init__(self, embedding: GraphTiered) -> None:
        super().__init__()
        object.__setattr__(self, "embedding", embedding)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.embedding.logits(hidden)


def swap_embeddings(model: nn.Module) -> list[str]:
    """Replace tiered embeddings (and the tied heads reading them) by their export forms; the replaced names."""
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, TieredEmbedding):
            graph = GraphTiered(module)
            model.set_submodule(name, graph)
            replaced.append(name)
            for head_name, head in list(model.named_modules()):
                if isinstance(head, TieredTiedHead) and head.embedding is module:
                    model.set_submodule(head_name, GraphTieredHead(graph))
                    replaced.append(head_name)
    return replaced
