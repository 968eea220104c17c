"""The adaptive vocabulary of a TT embedding (TensorSLM §2.1): tokens added, replaced, removed, kept dense.

Ships inside saved checkpoints: torch only. A mixin of ``TTEmbedding``: every token is its own train (the vocabulary
axis is never factorized), so editing a token touches its rows only. In float storage the cores are replaced by new
Parameters (returned as ``{old: new}`` for an optimizer); in low-bit storage the edited tokens' rows are re-encoded
and the others' codes are kept as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .solver import tt_svd
from .storage import stored_matrix, stored_trains, train_rows


class TTVocabulary:
    """Vocabulary edits of ``TTEmbedding`` (see there for the attributes they use)."""

    @torch.no_grad()
    def keep_exact(self, ids: torch.Tensor, vectors: torch.Tensor) -> None:
        """Serve tokens ``ids`` from dense rows ``vectors`` (e.g. the most frequent tokens), the rest from trains."""
        ids, order = torch.as_tensor(ids, dtype=torch.long).sort()
        rows = vectors[order].detach().to(self.token_ranks.device, self._dtype())
        old = self.exact_rows
        if self.code_bits is None:
            self.exact_rows = nn.Parameter(rows.clone(), True if old is None else old.requires_grad)
        else:
            self.exact_rows = stored_matrix(rows, self.code_bits, self.code_group_size)
        slot = torch.full((self.num_embeddings,), -1, dtype=torch.int32, device=self.token_ranks.device)
        slot[ids.to(slot.device)] = torch.arange(len(ids), dtype=torch.int32, device=slot.device)
        self.exact_slot = slot

    def _exact(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(token ids, their dense rows, decoded in low-bit storage) of the exact tokens, or None."""
        if self.exact_rows is None:
            return None
        ids = (self.exact_slot >= 0).nonzero().squeeze(1)
        return ids, self._exact_lookup(self.exact_slot[ids].long())

    def _load(self, cores: list[torch.Tensor], token_ranks: torch.Tensor) -> dict[nn.Parameter, nn.Parameter]:
        """Replace all trains (new Parameters, or new codes); returns ``{old: new}`` for
        ``replace_parameters_in_optimizer`` (empty in low-bit storage: nothing trains there)."""
        mapping = {}
        if self.code_bits is None:
            for k, core in enumerate(cores):
                old = self.cores[k]
                new = nn.Parameter(core.detach().to(old.device, old.dtype).contiguous(), old.requires_grad)
                self.cores[k] = new
                mapping[old] = new
        else:
            self.trains = stored_trains(cores, self.code_bits, self.code_group_size).to(self.token_ranks.device)
        self.token_ranks = token_ranks.to(self.token_ranks.device, torch.int32)
        return mapping

    def _compress(self, vectors: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """New vectors compressed like this layer's tokens, padded to the stored ranks."""
        vectors = vectors.to(self.token_ranks.device, self._dtype())
        basis = self._basis_matrix()
        if basis is not None:
            vectors = torch.linalg.solve(basis.double().T, vectors.double().T).T.to(vectors.dtype)
        cores, token_ranks = tt_svd(vectors, self.shape, self.ranks, self.eps, solver="eigh")
        bounds = [1, *self.ranks, 1]
        padded = [
            F.pad(core, (0, bounds[k + 1] - core.shape[-1], 0, 0, 0, bounds[k] - core.shape[1]))
            for k, core in enumerate(cores)
        ]
        return padded, token_ranks

    @torch.no_grad()
    def add_tokens(self, vectors: torch.Tensor) -> tuple[torch.Tensor, dict[nn.Parameter, nn.Parameter]]:
        """Append tokens whose vectors are ``vectors`` ``(n, d)``, compressed on the fly.

        Returns the new token ids and ``{old: new}`` parameters (for an optimizer holding the cores).
        """
        vectors = torch.as_tensor(vectors).reshape(-1, self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        start = self.num_embeddings
        ranks = torch.cat([self.token_ranks, new_ranks.to(self.token_ranks.device, torch.int32)])
        if self.code_bits is None:
            mapping = self._load([torch.cat([old.detach(), new]) for old, new in zip(self.cores, new_cores)], ranks)
        else:
            self.trains = self.trains.cat(stored_trains(new_cores, self.code_bits, self.code_group_size))
            self.token_ranks, mapping = ranks, {}
        if self.exact_slot is not None:
            self.exact_slot = torch.cat([self.exact_slot, self.exact_slot.new_full((vectors.shape[0],), -1)])
        return torch.arange(start, start + vectors.shape[0]), mapping

    @torch.no_grad()
    def remove_tokens(self, ids: torch.Tensor | list[int]) -> dict[nn.Parameter, nn.Parameter]:
        """Drop tokens ``ids``; the tokens after them move down (like removing rows of the embedding matrix)."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise IndexError(f"token ids must lie in [0, {self.num_embeddings}), got {ids.min()}..{ids.max()}")
        keep = torch.ones(self.num_embeddings, dtype=torch.bool)
        keep[ids] = False
        kept = keep.nonzero().squeeze(1).to(self.token_ranks.device)
        if self.code_bits is None:
            mapping = self._load([core.detach().index_select(0, kept) for core in self.cores], self.token_ranks[kept])
        else:
            self.trains, self.token_ranks, mapping = self.trains.select(kept), self.token_ranks[kept], {}
        if self.exact_slot is not None:
            slot = self.exact_slot[kept].clone()
            alive = slot >= 0
            if not alive.any():  # no exact token left (e.g. a resize undone): back to the plain layout
                self.exact_rows, self.exact_slot = None, None
                return mapping
            old = self.exact_rows
            if self.code_bits is None:
                self.exact_rows = nn.Parameter(old.detach()[slot[alive].long()], old.requires_grad)
                mapping[old] = self.exact_rows
            else:
                self.exact_rows = old.select(slot[alive].long())
            slot[alive] = torch.arange(int(alive.sum()), dtype=slot.dtype, device=slot.device)
            self.exact_slot = slot
        return mapping

    @torch.no_grad()
    def set_vectors(self, ids: torch.Tensor | list[int], vectors: torch.Tensor) -> None:
        """Re-compress tokens ``ids`` to new vectors in place (e.g. after ``resize_token_embeddings``)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.token_ranks.device).reshape(-1)
        vectors = torch.as_tensor(vectors).reshape(ids.numel(), self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        if self.code_bits is None:
            for core, new in zip(self.cores, new_cores):
                core[ids] = new  # through the Parameter, not .data: bumps _version, so caches see the change
        else:
            self.trains.set_rows(ids, train_rows(new_cores))
        self.token_ranks[ids] = new_ranks.to(self.token_ranks.device)
        if self.exact_slot is not None:
            slot = self.exact_slot[ids]
            hit = slot >= 0
            if self.code_bits is None:
                self.exact_rows[slot[hit].long()] = vectors[hit].to(self.exact_rows)
            elif hit.any():
                self.exact_rows.set_rows(slot[hit].long(), vectors[hit].to(self._dtype()))

    @torch.no_grad()
    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None):
        """``resize_token_embeddings`` support, in place: new tokens start at the mean vector, as transformers'
        ``mean_resizing`` does (without its random perturbation, so resizing is deterministic), held as dense rows
        (a train at the layer's ranks would miss the mean by ~1e-3; low-bit storage holds them at its width);
        shrinking drops the last tokens."""
        target = self.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of:
            target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
        if target > self.num_embeddings:
            mean = self.weight.detach().mean(dim=0, keepdim=True)
            kept = self._exact()
            new_ids, _ = self.add_tokens(mean.expand(target - self.num_embeddings, -1))
            rows = mean.expand(len(new_ids), -1)
            if kept is not None:
                new_ids, rows = torch.cat([kept[0].cpu(), new_ids]), torch.cat([kept[1].detach(), rows.to(kept[1])])
            self.keep_exact(new_ids, rows)
        elif target < self.num_embeddings:
            self.remove_tokens(torch.arange(target, self.num_embeddings))
        return self
