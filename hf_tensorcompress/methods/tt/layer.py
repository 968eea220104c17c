"""Tensor-train token embeddings (TensorSLM): every token's vector is its own tensor train.

Ships inside saved checkpoints: torch only.

Storage layout: core ``k`` of the whole vocabulary is one parameter of shape ``(V, R_{k-1}, I_k, R_k)``
(``R_0 = R_N = 1``). ``R_k`` are the layer's *stored* ranks. When tokens get different ranks (the ε mode, or
weighted per-token budgets), each token's train is zero-padded up to ``R_k``: the padded slices are exact zeros,
so reconstruction is unaffected, and the per-token ranks are kept in the ``token_ranks`` buffer. Parameter
counts are therefore reported twice: ``stored_parameters()`` (what this padded layout holds) and
``effective_parameters()`` (Σ over tokens of Σ_k r_{k-1} I_k r_k, what a ragged layout would hold).
The vocabulary axis is never factorized, so single tokens can be added, replaced or removed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...core.contract import CompressedLayer
from .head import TTTiedHead
from .logits import LOGIT_PATHS, TensorsState, best_cut, factored_logits, token_minor_blocks
from .solver import tt_reconstruct, tt_svd


class TTEmbedding(CompressedLayer, nn.Embedding):
    """Drop-in for ``nn.Embedding``: token ``t``'s vector is the tensor train ``G_1[t] G_2[t] … G_N[t]``.

    It is an ``nn.Embedding`` to transformers (``get_input_embeddings()`` returns one, as its model contract asks)
    without the dense matrix: ``nn.Embedding.__init__`` is not run; the lookup options are its defaults.

    ``forward(ids)`` reconstructs only the requested tokens. ``weight`` reconstructs the whole ``(V, d)`` matrix
    (used by ``resize_token_embeddings`` and by the tied output head). ``eps`` and ``max_ranks`` are kept so that
    tokens added later are compressed the same way; a new token never gets ranks above the stored ones.
    """

    layer_type = "tt_embedding"

    def __init__(
        self,
        num_embeddings: int,
        shape: list[int],
        ranks: list[int],
        eps: float | None = None,
        tied_output: str | None = None,
        basis: bool = False,
        exact_tokens: int = 0,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        nn.Module.__init__(self)  # not nn.Embedding's: it would allocate the V×d weight
        self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse = (
            None,
            None,
            2.0,
            False,
            False,
        )
        shape, ranks = [int(i) for i in shape], [int(r) for r in ranks]
        if len(ranks) != len(shape) - 1 or min(shape) < 1 or (ranks and min(ranks) < 1):
            raise ValueError(
                f"a {len(shape)}-core train needs {len(shape) - 1} ranks >= 1; got shape={shape}, ranks={ranks}"
            )
        self.shape, self.ranks, self.eps, self.tied_output = shape, ranks, eps, tied_output
        size = math.prod(shape)
        # optional output-aware basis P (d×d): vector = train @ P; the trains live in the basis P⁻¹ (see tt_basis)
        self.register_buffer("basis", torch.eye(size, device=device, dtype=dtype) if basis else None)
        # optional exact tokens: their vectors are stored dense (exact_rows[slot]); exact_slot[t] = slot or -1
        self.exact_rows = (
            nn.Parameter(torch.zeros(exact_tokens, size, device=device, dtype=dtype)) if exact_tokens else None
        )
        self.register_buffer(
            "exact_slot",
            torch.full((num_embeddings,), -1, dtype=torch.int32, device=device) if exact_tokens else None,
        )
        bounds = [1, *ranks, 1]
        self.cores = nn.ParameterList(
            nn.Parameter(torch.zeros(num_embeddings, bounds[k], shape[k], bounds[k + 1], device=device, dtype=dtype))
            for k in range(len(shape))
        )
        self.register_buffer(
            "token_ranks", torch.tensor(ranks, dtype=torch.int32, device=device).repeat(num_embeddings, 1)
        )
        self._split_cache: tuple | None = None  # see _token_split
        self._blocks_cache: tuple | None = None  # see _decode_blocks

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A random train per token, every token at the stored ranks, in the identity basis, no exact tokens: the
        init of a layer no checkpoint filled. Each core is N(0, σ²) with ``σ^(2N) · Π r_k = 1``, so vectors have
        unit variance like ``nn.Embedding``'s N(0, 1) rows."""
        order = len(self.shape)
        std = math.prod(self.ranks) ** (-1.0 / (2 * order))
        for core in self.cores:
            nn.init.normal_(core, 0.0, std)
        self.token_ranks.copy_(torch.tensor(self.ranks, dtype=torch.int32).expand_as(self.token_ranks))
        if self.basis is not None:
            self.basis.copy_(torch.eye(self.embedding_dim))
        if self.exact_rows is not None:
            nn.init.zeros_(self.exact_rows)
            self.exact_slot.fill_(-1)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_weight(
        cls,
        weight: torch.Tensor,
        shape: list[int],
        max_ranks: list[int] | None = None,
        eps: float | torch.Tensor | None = None,
        basis: torch.Tensor | None = None,
        solver: str = "auto",
    ) -> TTEmbedding:
        """Compress a ``(V, d)`` embedding matrix (training-free). A tensor ``eps`` gives per-token accuracies.

        ``basis`` (``(d, d)``, invertible) decomposes the rows of ``W P⁻¹`` instead of ``W`` and stores ``P``:
        vectors are ``train @ P``. With ``P⁻¹ = C^{1/2} Q`` (``C`` the covariance of the hidden states the tied
        output layer sees, ``Q`` the principal axes of ``W C^{1/2}``) truncation minimises the logit error
        ``E‖h·(w − ŵ)‖²`` rather than ``‖w − ŵ‖²``: see ``methods.tt.output_basis``. ``solver``: see
        ``tt_svd`` (default ``"auto"``: power iteration for fixed ranks, eigh for the ε mode; tokens added later
        always use the exact ``"eigh"``: a handful of vectors gains nothing from ``"power"``).
        """
        if max_ranks is None and eps is None:
            raise ValueError("give max_ranks, eps, or both: without either TT-SVD keeps every vector exactly")
        inverse = None if basis is None else torch.linalg.inv(basis.double())
        target = weight if inverse is None else (weight.double() @ inverse).to(weight.dtype)
        cores, token_ranks = tt_svd(target, shape, max_ranks, eps, solver)
        layer = cls(
            weight.shape[0],
            shape,
            [core.shape[-1] for core in cores[:-1]],
            eps=float(eps) if isinstance(eps, (int, float)) else None,
            basis=basis is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        layer._load(cores, token_ranks)
        if basis is not None:
            layer.basis.copy_(basis)
        return layer

    @torch.no_grad()
    def keep_exact(self, ids: torch.Tensor, vectors: torch.Tensor) -> None:
        """Serve tokens ``ids`` from dense rows ``vectors`` (e.g. the most frequent tokens), the rest from trains."""
        ids, order = torch.as_tensor(ids, dtype=torch.long).sort()
        rows = vectors[order].detach().to(self.cores[0])
        old = self.exact_rows
        self.exact_rows = nn.Parameter(rows.clone(), True if old is None else old.requires_grad)
        slot = torch.full((self.num_embeddings,), -1, dtype=torch.int32, device=self.cores[0].device)
        slot[ids.to(slot.device)] = torch.arange(len(ids), dtype=torch.int32, device=slot.device)
        self.exact_slot = slot

    def _exact(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(token ids, their dense rows) of the exact tokens, or None."""
        if self.exact_rows is None:
            return None
        ids = (self.exact_slot >= 0).nonzero().squeeze(1)
        return ids, self.exact_rows.index_select(0, self.exact_slot[ids].long())

    def _load(self, cores: list[torch.Tensor], token_ranks: torch.Tensor) -> dict[nn.Parameter, nn.Parameter]:
        """Replace all cores (new Parameters); returns ``{old: new}`` for ``replace_parameters_in_optimizer``."""
        mapping = {}
        for k, core in enumerate(cores):
            old = self.cores[k]
            new = nn.Parameter(core.detach().to(old.device, old.dtype).contiguous(), old.requires_grad)
            self.cores[k] = new
            mapping[old] = new
        self.token_ranks = token_ranks.to(self.token_ranks.device, torch.int32)
        return mapping

    def _compress(self, vectors: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """New vectors compressed like this layer's tokens, padded to the stored ranks."""
        vectors = vectors.to(self.cores[0])
        if self.basis is not None:
            vectors = torch.linalg.solve(self.basis.double().T, vectors.double().T).T.to(vectors.dtype)
        cores, token_ranks = tt_svd(vectors, self.shape, self.ranks, self.eps, solver="eigh")
        bounds = [1, *self.ranks, 1]
        padded = [
            F.pad(core, (0, bounds[k + 1] - core.shape[-1], 0, 0, 0, bounds[k] - core.shape[1]))
            for k, core in enumerate(cores)
        ]
        return padded, token_ranks

    # ------------------------------------------------------------------ adaptive vocabulary (paper §2.1)
    @torch.no_grad()
    def add_tokens(self, vectors: torch.Tensor) -> tuple[torch.Tensor, dict[nn.Parameter, nn.Parameter]]:
        """Append tokens whose vectors are ``vectors`` ``(n, d)``, compressed on the fly.

        Returns the new token ids and ``{old: new}`` parameters (for an optimizer holding the cores).
        """
        vectors = torch.as_tensor(vectors).reshape(-1, self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        start = self.num_embeddings
        mapping = self._load(
            [torch.cat([old.detach(), new]) for old, new in zip(self.cores, new_cores)],
            torch.cat([self.token_ranks, new_ranks.to(self.token_ranks.device)]),
        )
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
        mapping = self._load([core.detach().index_select(0, kept) for core in self.cores], self.token_ranks[kept])
        if self.exact_slot is not None:
            slot = self.exact_slot[kept].clone()
            alive = slot >= 0
            if not alive.any():  # no exact token left (e.g. a resize undone): back to the plain layout
                self.exact_rows, self.exact_slot = None, None
                return mapping
            old = self.exact_rows
            self.exact_rows = nn.Parameter(old.detach()[slot[alive].long()], old.requires_grad)
            slot[alive] = torch.arange(int(alive.sum()), dtype=slot.dtype, device=slot.device)
            self.exact_slot = slot
            mapping[old] = self.exact_rows
        return mapping

    @torch.no_grad()
    def set_vectors(self, ids: torch.Tensor | list[int], vectors: torch.Tensor) -> None:
        """Re-compress tokens ``ids`` to new vectors in place (e.g. after ``resize_token_embeddings``)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.token_ranks.device).reshape(-1)
        vectors = torch.as_tensor(vectors).reshape(ids.numel(), self.embedding_dim)
        new_cores, new_ranks = self._compress(vectors)
        for core, new in zip(self.cores, new_cores):
            core[ids] = new  # through the Parameter, not .data: bumps _version, so caches see the change
        self.token_ranks[ids] = new_ranks.to(self.token_ranks.device)
        if self.exact_slot is not None:
            slot = self.exact_slot[ids]
            self.exact_rows[slot[slot >= 0].long()] = vectors[slot >= 0].to(self.exact_rows)

    @torch.no_grad()
    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None) -> TTEmbedding:
        """``resize_token_embeddings`` support, in place: new tokens start at the mean vector, as transformers'
        ``mean_resizing`` does (without its random perturbation, so resizing is deterministic), held exactly as
        dense rows (a train at the layer's ranks would miss the mean by ~1e-3); shrinking drops the last tokens."""
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

    # ------------------------------------------------------------------ model integration
    def bind(self, model: nn.Module) -> None:
        """Called once the layer sits in ``model``: take over the tied output layer (or untie it).

        transformers ties ``lm_head.weight`` to the embedding's ``weight`` parameter, which no longer exists, so
        the config's tying is switched off; a tied model gets a ``TTTiedHead`` reading this layer's cores.
        """
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        for config in {id(model.config): model.config, id(text_config): text_config}.values():
            if getattr(config, "tie_word_embeddings", False):
                config.tie_word_embeddings = False
        if hasattr(model, "all_tied_weights_keys"):
            model.all_tied_weights_keys = {}
        # nothing shares storage any more (the head reads the cores): the class's {"lm_head.weight": ...} pattern
        # would name keys the state dict no longer has
        model._tied_weights_keys = {}
        if self.tied_output is not None:
            model.set_submodule(self.tied_output, TTTiedHead(self))

    def unbind(self, model: nn.Module, reference: nn.Module) -> None:
        """``decompress``: the tied head goes back to the dense output layer (tied again by the caller, by the
        class's tied-weight patterns again)."""
        vars(model).pop("_tied_weights_keys", None)
        if self.tied_output is not None:
            head = reference.get_submodule(self.tied_output)
            model.set_submodule(self.tied_output, head.to_empty(device=self.cores[0].device).to(self.cores[0].dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        vectors = self._apply_basis(tt_reconstruct(list(self.cores), flat))
        if self.exact_rows is not None:
            slot = self.exact_slot[flat].long()
            exact = self.exact_rows.index_select(0, slot.clamp(min=0))
            vectors = torch.where((slot >= 0)[:, None], exact, vectors)
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def _apply_basis(self, trains: torch.Tensor) -> torch.Tensor:
        return trains if self.basis is None else trains @ self.basis

    def logits(
        self, hidden: torch.Tensor, trains: torch.Tensor | None = None, chunk: int = 4096, path: str = "auto"
    ) -> torch.Tensor:
        """``hidden @ weightᵀ`` over the whole vocabulary, the basis applied to ``hidden`` (``L·d²``) rather than to
        all V trains, exact tokens as one dense block.

        ``path``: ``"factored"`` contracts the projected hidden states with the trains of the non-exact tokens
        (``factored_logits``, no ``V×d`` matrix); ``"rebuild"`` (the reference) rebuilds every train ``chunk``
        tokens at a time and overwrites the exact tokens; ``"auto"`` takes ``"factored"`` while its estimated cost
        per token (``best_cut``) is below a dense row's ``d``, i.e. for the few rows of decoding, and
        ``"rebuild"`` for long inputs, where one rebuilt matrix serves many rows. Precomputed ``trains``
        (``(V, d)``, the cached mode of ``TTTiedHead``) replace the rebuild."""
        if path not in LOGIT_PATHS:
            raise ValueError(f"path={path!r}; choose one of {list(LOGIT_PATHS)}")
        lead, raw = hidden.shape[:-1], hidden.reshape(-1, hidden.shape[-1])
        projected = raw if self.basis is None else F.linear(raw, self.basis)
        if path == "auto":
            path = "factored" if self._factored_is_cheaper(raw.shape[0]) else "rebuild"
        if trains is not None:
            logits = self._exact_logits(raw, F.linear(projected, trains))
        elif path == "factored":
            logits = self._factored(raw, projected)
        else:
            cores, vocab = list(self.cores), self.num_embeddings
            ids = torch.arange(vocab, device=cores[0].device)
            logits = self._exact_logits(
                raw,
                torch.cat(
                    [
                        F.linear(projected, tt_reconstruct(cores, ids[start : start + chunk]))
                        for start in range(0, vocab, chunk)
                    ],
                    dim=-1,
                ),
            )
        return logits.reshape(*lead, self.num_embeddings)

    def _factored_is_cheaper(self, rows: int) -> bool:
        """Whether ``factored_logits`` touches fewer floats per token than a (rebuilt or dense) row of ``d``."""
        return best_cut(self.shape, [core.shape[-1] for core in self.cores[:-1]], rows)[1] < self.embedding_dim

    def _exact_logits(self, raw: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the exact tokens' columns replaced by ``raw @ exact_rowsᵀ`` (the rows as stored, no gather)."""
        if self.exact_rows is None:
            return logits
        return logits.index_copy(-1, self._token_split()[0], F.linear(raw, self.exact_rows))

    def _factored(self, raw: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Logits without a ``V×d`` matrix: exact tokens as one dense GEMM over ``exact_rows`` as stored (no
        gather), the other tokens by ``factored_logits`` over their trains only."""
        cores = list(self.cores)
        if self.exact_rows is None:
            return factored_logits(projected, cores, blocks=self._decode_blocks(None))
        by_slot, train_ids = self._token_split()
        logits = raw.new_empty(raw.shape[0], self.num_embeddings)
        logits.index_copy_(1, by_slot, F.linear(raw, self.exact_rows))
        if train_ids.numel():
            logits.index_copy_(
                1, train_ids, factored_logits(projected, cores, train_ids, blocks=self._decode_blocks(train_ids))
            )
        return logits

    def __getstate__(self) -> dict:
        """Pickled without the decoding caches (they hold weak references, and are rebuilt on use)."""
        return {**super().__getstate__(), "_split_cache": None, "_blocks_cache": None}

    def _token_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the token of each exact slot, the tokens served by trains), computed once per ``exact_slot``: every
        decoding step needs both, and finding them scans the vocabulary."""
        slot = self.exact_slot
        if self._split_cache is None or not self._split_cache[0].matches([slot]):
            exact_ids = (slot >= 0).nonzero().squeeze(1)
            by_slot = torch.empty_like(exact_ids).index_copy_(0, slot[exact_ids].long(), exact_ids)
            self._split_cache = (TensorsState([slot]), by_slot, (slot < 0).nonzero().squeeze(1))
        return self._split_cache[1], self._split_cache[2]

    def _decode_blocks(self, ids: torch.Tensor | None) -> list[list[torch.Tensor]] | None:
        """The train tokens' cores laid out for ``factored_logits``, kept between decoding steps while the cores
        and ``ids`` are unchanged (the size of those cores; transposing them per step cost a sixth of a step).
        None while the cores train: the layout must follow their gradients, so it is built per call."""
        if torch.is_grad_enabled() and any(core.requires_grad for core in self.cores):
            self._blocks_cache = None
            return None
        sources = [*self.cores] + ([] if ids is None else [ids])
        if self._blocks_cache is None or not self._blocks_cache[0].matches(sources):
            self._blocks_cache = None  # free the old layout before building the new one
            self._blocks_cache = (TensorsState(sources), token_minor_blocks(list(self.cores), ids))
        return self._blocks_cache[1]

    @property
    def weight(self) -> torch.Tensor:
        """The whole ``(V, d)`` embedding matrix, reconstructed (differentiable w.r.t. the cores)."""
        weight = self._apply_basis(tt_reconstruct(list(self.cores)))
        exact = self._exact()
        return weight if exact is None else weight.index_copy(0, exact[0], exact[1])

    @property
    def num_embeddings(self) -> int:
        return self.cores[0].shape[0]

    @property
    def embedding_dim(self) -> int:
        return math.prod(self.shape)

    def spec(self) -> dict:
        return {
            "type": self.layer_type,
            "num_embeddings": self.num_embeddings,
            "shape": list(self.shape),
            "ranks": list(self.ranks),
            "eps": self.eps,
            "tied_output": self.tied_output,
            "basis": self.basis is not None,
            "exact_tokens": 0 if self.exact_rows is None else self.exact_rows.shape[0],
        }

    @classmethod
    def from_spec(cls, spec: dict) -> TTEmbedding:
        return cls(
            spec["num_embeddings"],
            spec["shape"],
            spec["ranks"],
            spec.get("eps"),
            spec.get("tied_output"),
            spec.get("basis", False),
            spec.get("exact_tokens", 0),
        )

    # ------------------------------------------------------------------ size and cost
    def dense_parameters(self) -> int:
        """Parameters of the ``nn.Embedding`` this layer replaces (a tied output layer shares them)."""
        return self.num_embeddings * self.embedding_dim

    def stored_parameters(self) -> int:
        return sum(core.numel() for core in self.cores) + self._basis_parameters()

    def _basis_parameters(self) -> int:
        """The basis matrix and the dense rows of exact tokens (their trains are still stored and counted)."""
        return (0 if self.basis is None else self.basis.numel()) + (
            0 if self.exact_rows is None else self.exact_rows.numel()
        )

    def effective_parameters(self) -> int:
        """Σ over tokens of Σ_k r_{k-1} I_k r_k with every token's own ranks (what a ragged layout stores)."""
        ones = torch.ones(self.num_embeddings, 1, dtype=torch.long, device=self.token_ranks.device)
        bounds = torch.cat([ones, self.token_ranks.long(), ones], dim=1)
        modes = torch.tensor(self.shape, device=bounds.device)
        return int((bounds[:, :-1] * modes * bounds[:, 1:]).sum()) + self._basis_parameters()

    def reconstruct_multiply_adds(self) -> int:
        """Multiply-adds to rebuild one token's vector from its (stored-rank) train."""
        bounds, rows, total = [1, *self.ranks, 1], self.shape[0], 0
        for k in range(1, len(self.shape)):
            total += rows * bounds[k] * self.shape[k] * bounds[k + 1]
            rows *= self.shape[k]
        return total

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        """Multiply-adds of looking up ``tokens`` tokens (one train contraction each)."""
        return tokens * self.reconstruct_multiply_adds(), "tt-reconstruct"

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, shape={self.shape}, ranks={self.ranks}, eps={self.eps}"
