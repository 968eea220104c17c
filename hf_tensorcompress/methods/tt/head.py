"""The tied output layer of a model whose token embedding is a ``TTEmbedding``.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.contract import TiedHead
from .logits import LOGIT_PATHS, TensorsState

#: ``TTTiedHead.mode`` values: a ``LOGIT_PATHS`` entry, or ``"cached"`` (one rebuilt ``V×d`` copy kept).
HEAD_MODES = (*LOGIT_PATHS, "cached")


class TTTiedHead(TiedHead):
    """The output layer of a tied model: ``logits = h Wᵀ`` read from the TT embedding's cores.

    It owns no tensors (the tied matrix is counted once, in the embedding). ``mode`` (default ``"auto"``):
    ``"auto"``/``"factored"``/``"rebuild"`` are ``TTEmbedding.logits`` paths: for the one row per sequence of
    ``generate()`` (transformers passes ``logits_to_keep=1``) ``"auto"`` contracts the hidden state with the
    factored trains, never building the ``V×d`` matrix, so decoding costs no more than the dense head and holds no
    dense copy; for long inputs it rebuilds the matrix ``chunk`` tokens at a time (a transient of one chunk).
    ``"cached"`` keeps one rebuilt ``V×d`` copy while the cores are unchanged (dense memory, dense speed, for
    evaluation loops over long windows, also of a low-bit embedding); ``cache_weight = True`` is the older spelling
    of it.
    """

    def __init__(self, embedding: nn.Module) -> None:
        """``embedding``: the ``TTEmbedding`` whose cores hold the tied matrix."""
        super().__init__(embedding)
        self.mode = "auto"
        self._cache: tuple[tuple, torch.Tensor] | None = None

    @property
    def cache_weight(self) -> bool:
        return self.mode == "cached"

    @cache_weight.setter
    def cache_weight(self, value: bool) -> None:
        self.mode = "cached" if value else "auto"

    def _cached_trains(self) -> torch.Tensor | None:
        """The rebuilt ``(V, d)`` trains in the cached mode while nothing needs gradients, else None (and the
        copy is dropped). Rebuilt only when a core was replaced, moved or changed in place."""
        if self.mode != "cached" or torch.is_grad_enabled():
            self._cache = None
            return None
        sources = self.embedding.stored_tensors()
        if self._cache is None or not self._cache[0].matches(sources):
            self._cache = None  # free the old copy before building the new one
            self._cache = (TensorsState(sources), self.embedding._train_vectors())
        return self._cache[1]

    def __getstate__(self) -> dict:
        """Pickled without the cached copy (it holds weak references, and is rebuilt on use)."""
        return {**super().__getstate__(), "_cache": None}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.mode not in HEAD_MODES:
            raise ValueError(f"TTTiedHead.mode={self.mode!r}; choose one of {list(HEAD_MODES)}")
        trains = self._cached_trains()
        return self.embedding.logits(hidden, trains, path="rebuild" if self.mode == "cached" else self.mode)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode}"
