"""Export forms of the compressed token embeddings and their tied heads.

Tiered: every tier keeps its packed codes (or codebook indices), group scales and codebook as initializers; a lookup
gathers the token's packed row and decodes only that row in the graph (``Gather`` → unpack → scale), and the tied
head decodes each tier and multiplies it with the hidden states, so the one stored table serves both, as in the
checkpoint (tiers whose width and groups ONNX Runtime's kernels take: ``GatherBlockQuantized`` rows and a
``MatMulNBits`` product instead, ``unpack.GraphLowBit``). TT: the per-token cores (fp32, or the packed ``(V, P)``
trains of ``tt_storage_bits``) are gathered for the looked-up tokens and contracted with batched ``MatMul``s; the
tied head rebuilds every train in the graph, applies the basis to the hidden states and puts the exact tokens' dense
rows in their columns.
"""

from __future__ import annotations

import torch
from torch import nn

from ...methods.tiered.layer import TieredEmbedding, TieredTiedHead, where_every_tier
from ...methods.tiered.scaled import ScaledTieredEmbedding
from ...methods.tt.head import TTTiedHead
from ...methods.tt.layer import TTEmbedding
from ...methods.tt.scaled import ScaledTTEmbedding
from ...methods.tt.storage import core_sizes
from .unpack import graph_form

NARROW_SLOT_OFFSET = 32768
"""int16 holds the rows 0..65,535 of a vocabulary up to that size shifted down by this."""


def narrow_slot(slot: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The token→row map in 16 bits where the rows fit, with the offset that restores them: half the checkpoint's
    32-bit map (98 KB on a 49,152-token vocabulary), which more than pays for the graph's decoding nodes."""
    if len(slot) > 2 * NARROW_SLOT_OFFSET:
        return slot, 0
    return (slot.long() - NARROW_SLOT_OFFSET).to(torch.int16), NARROW_SLOT_OFFSET


class GraphTiered(nn.Module):
    """``TieredEmbedding`` in graph ops: ``slot[token]`` picks the stored row (``slot`` in 16 bits where the rows
    fit, ``narrow_slot``); each tier decodes the rows its range holds (the others read a clamped row and are
    discarded by a ``Where``), plus the low-rank part of the last tier."""

    def __init__(self, layer: TieredEmbedding) -> None:
        super().__init__()
        self.embedding_dim, self.rank = layer.embedding_dim, layer.rank
        self.ranges = layer._ranges()
        self.low_rank_start, self.tier_rows = layer.low_rank_start, [tier["rows"] for tier in layer.tier_specs]
        self.tier_stores = [bool(tier["bits"]) for tier in layer.tier_specs]
        slot, self.slot_offset = narrow_slot(layer.slot)
        self.register_buffer("slot", slot)
        self.tiers = nn.ModuleList(graph_form(stored) for stored in layer.tiers)
        if layer.rank:
            self.left, self.right = graph_form(layer.left), graph_form(layer.right)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        slot = self._rows(self.slot.index_select(0, input_ids.reshape(-1)))
        tiers = [(start, end, stored.rows) for stored, (start, end) in zip(self.tiers, self.ranges)]
        low_rank = (
            (self.low_rank_start, lambda index: self.left.rows(index) @ self.right.values()) if self.rank else None
        )
        vectors = where_every_tier(slot, tiers, self.embedding_dim, torch.float32, low_rank)
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden @ Wᵀ`` in token order: each tier's decoded rows times the hidden states, concatenated in the
        stored order, then put in token order by ``slot``."""
        stored, scores = iter(self.tiers), []
        for rows, stores in zip(self.tier_rows, self.tier_stores):
            scores.append(next(stored).matmul_t(hidden) if stores else hidden.new_zeros(*hidden.shape[:-1], rows))
        scores = torch.cat(scores, dim=-1)
        if self.rank:
            low_rank = self.left.matmul_t(self.right.matmul_t(hidden))
            scores = torch.cat([scores[..., : self.low_rank_start], scores[..., self.low_rank_start :] + low_rank], -1)
        return scores.index_select(-1, self._rows(self.slot))

    def _rows(self, slot: torch.Tensor) -> torch.Tensor:
        """Stored ``slot`` entries as int64 row numbers."""
        return slot.long() + self.slot_offset if self.slot_offset else slot.long()


class GraphTT(nn.Module):
    """``TTEmbedding`` in graph ops (float cores or ``tt_storage_bits`` codes; basis; exact tokens)."""

    def __init__(self, layer: TTEmbedding) -> None:
        super().__init__()
        self.shape, self.ranks, self.embedding_dim = list(layer.shape), list(layer.ranks), layer.embedding_dim
        self.low_bit = layer.code_bits is not None
        if self.low_bit:
            self.trains = graph_form(layer.trains)
        else:
            self.cores = nn.ParameterList(nn.Parameter(core.detach(), requires_grad=False) for core in layer.cores)
        basis = layer.basis
        self.basis = None if basis is None else (graph_form(basis) if self.low_bit else nn.Buffer(basis.detach()))
        exact = layer.exact_rows
        self.exact_rows = None
        if exact is not None:
            self.exact_rows = graph_form(exact) if self.low_bit else nn.Buffer(exact.detach())
            self.register_buffer("exact_slot", layer.exact_slot)

    def _cores(self, ids: torch.Tensor) -> list[torch.Tensor]:
        if not self.low_bit:
            return [core.index_select(0, ids) for core in self.cores]
        rows, bounds = self.trains.rows(ids), [1, *self.ranks, 1]
        parts = rows.split(core_sizes(self.shape, self.ranks), dim=1)
        return [part.reshape(-1, bounds[k], self.shape[k], bounds[k + 1]) for k, part in enumerate(parts)]

    def _trains(self, ids: torch.Tensor) -> torch.Tensor:
        """``(n, d)`` trains of ``ids`` (``solver._contract``: right to left, batched ``MatMul``s)."""
        cores = self._cores(ids)
        out = cores[-1].reshape(cores[-1].shape[0], cores[-1].shape[1], -1)
        for core in reversed(cores[:-1]):
            rank_in, mode, rank_out = core.shape[1:]
            out = torch.matmul(core.reshape(-1, rank_in * mode, rank_out), out).reshape(core.shape[0], rank_in, -1)
        return out.reshape(out.shape[0], -1)

    def _matrix(self, stored: nn.Module | torch.Tensor) -> torch.Tensor:
        return stored.values() if self.low_bit else stored

    def _matmul_t(self, x: torch.Tensor, stored: nn.Module | torch.Tensor) -> torch.Tensor:
        return stored.matmul_t(x) if self.low_bit else x @ stored.T

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1).long()
        vectors = self._trains(flat)
        if self.basis is not None:
            vectors = vectors @ self._matrix(self.basis)
        if self.exact_rows is not None:
            slot = self.exact_slot.index_select(0, flat).long()
            at = slot.clamp(min=0)
            exact = self.exact_rows.rows(at) if self.low_bit else self.exact_rows.index_select(0, at)
            vectors = torch.where((slot >= 0)[:, None], exact, vectors)
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        vocab = self.trains.shape[0] if self.low_bit else self.cores[0].shape[0]
        projected = hidden if self.basis is None else self._matmul_t(hidden, self.basis)
        logits = projected @ self._trains(torch.arange(vocab)).T
        if self.exact_rows is None:
            return logits
        exact = self._matmul_t(hidden, self.exact_rows)
        slot = self.exact_slot.long()
        return torch.where(slot >= 0, exact.index_select(-1, slot.clamp(min=0)), logits)


class _ScaledLookup:
    """The lookup times ``embed_scale`` (Gemma's scaled embeddings), applied as the scaled layers apply it (an fp32
    constant cast to the output's dtype); ``logits`` (the tied head) reads the unscaled table, as the checkpoint's
    head does."""

    def __init__(self, layer: ScaledTTEmbedding | ScaledTieredEmbedding) -> None:
        super().__init__(layer)
        self.embed_scale = layer.embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        vectors = super().forward(input_ids)
        return vectors * torch.tensor(self.embed_scale, dtype=torch.float32).to(vectors.dtype)


class GraphScaledTT(_ScaledLookup, GraphTT):
    """``ScaledTTEmbedding`` in graph ops."""


class GraphScaledTiered(_ScaledLookup, GraphTiered):
    """``ScaledTieredEmbedding`` in graph ops."""


class GraphTiedHead(nn.Module):
    """The tied output layer: the embedding's ``logits`` (a reference, not a submodule: one table in the file)."""

    def __init__(self, embedding: GraphTiered) -> None:
        super().__init__()
        object.__setattr__(self, "embedding", embedding)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.embedding.logits(hidden)


#: compressed embedding → (its export form, the tied head type that reads it)
EMBEDDING_FORMS = {
    TieredEmbedding: (GraphTiered, TieredTiedHead),
    TTEmbedding: (GraphTT, TTTiedHead),
    ScaledTTEmbedding: (GraphScaledTT, TTTiedHead),
    ScaledTieredEmbedding: (GraphScaledTiered, TieredTiedHead),
}


def swap_embeddings(model: nn.Module) -> list[str]:
    """Replace compressed embeddings (and the tied heads reading them) by their export forms; the replaced names."""
    replaced = []
    for name, module in list(model.named_modules()):
        if type(module) in EMBEDDING_FORMS:
            form, head_type = EMBEDDING_FORMS[type(module)]
            graph = form(module)
            model.set_submodule(name, graph)
            replaced.append(name)
            for head_name, head in list(model.named_modules()):
                if isinstance(head, head_type) and head.embedding is module:
                    model.set_submodule(head_name, GraphTiedHead(graph))
                    replaced.append(head_name)
    return replaced
