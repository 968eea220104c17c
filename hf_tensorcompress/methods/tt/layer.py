"""Tensor-train token embeddings (TensorSLM): every token's vector is its own tensor train.

Ships inside saved checkpoints: torch only.

Storage layout: core ``k`` of the whole vocabulary is one parameter of shape ``(V, R_{k-1}, I_k, R_k)``
(``R_0 = R_N = 1``). ``R_k`` are the layer's *stored* ranks. When tokens get different ranks (the ε mode, or
weighted per-token budgets), each token's train is zero-padded up to ``R_k``: the padded slices are exact zeros,
so reconstruction is unaffected, and the per-token ranks are kept in the ``token_ranks`` buffer. Parameter
counts are therefore reported twice: ``stored_parameters()`` (what this padded layout holds) and
``effective_parameters()`` (Σ over tokens of Σ_k r_{k-1} I_k r_k, what a ragged layout would hold).
The vocabulary axis is never factorized, so single tokens can be added, replaced or removed (``vocabulary.py``).

Low-bit storage (``code_bits``, see ``storage.py``): the trains are one ``(V, P)`` ``LowBitTensor``, the exact rows
and the basis are ``LowBitTensor`` matrices, and that packed form is what the layer holds in memory; lookups decode
the requested tokens' rows, the tied output layer one block of tokens at a time (``logits.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.contract import CompressedLayer, TensorProblem, untie_word_embeddings
from .head import TTTiedHead
from .logits import FACTORED_BLOCK, TensorsState, TTLogits, token_minor_blocks
from .solver import RECONSTRUCT_BLOCK, tt_reconstruct, tt_svd
from .storage import (
    check_code_storage,
    core_sizes,
    matrix_form,
    stored_matrix,
    stored_trains,
    trains_form,
    unpack_rows,
)
from .vocabulary import TTVocabulary


class TTEmbedding(TTVocabulary, TTLogits, CompressedLayer, nn.Embedding):
    """Drop-in for ``nn.Embedding``: token ``t``'s vector is the tensor train ``G_1[t] G_2[t] … G_N[t]``.

    It is an ``nn.Embedding`` to transformers (``get_input_embeddings()`` returns one, as its model contract asks)
    without the dense matrix: ``nn.Embedding.__init__`` is not run; the lookup options are its defaults.

    ``forward(ids)`` reconstructs only the requested tokens. ``weight`` reconstructs the whole ``(V, d)`` matrix
    (used by ``resize_token_embeddings`` and by the tied output head). ``eps`` and ``max_ranks`` are kept so that
    tokens added later are compressed the same way; a new token never gets ranks above the stored ones.
    ``code_bits`` (2, 3, 4 or 8) builds the low-bit form (codes, no float trains; ``store_codes`` turns a float
    layer into it), ``code_group_size`` its scale groups (``storage.py``).
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
        code_bits: int | None = None,
        code_group_size: int | None = None,
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
        if code_bits is not None:
            check_code_storage(code_bits, code_group_size, size)
        self.code_bits, self.code_group_size = code_bits, code_group_size
        self.register_buffer(
            "exact_slot",
            torch.full((num_embeddings,), -1, dtype=torch.int32, device=device) if exact_tokens else None,
        )
        self.register_buffer(
            "token_ranks", torch.tensor(ranks, dtype=torch.int32, device=device).repeat(num_embeddings, 1)
        )
        # the model's dtype (outputs of the low-bit form, whose codes keep their own dtypes; reference for reports)
        self.register_buffer("dtype_probe", torch.zeros(0, device=device, dtype=dtype), persistent=False)
        if code_bits is not None:
            self.cores = None
            self.trains = trains_form(num_embeddings, shape, ranks, code_bits, code_group_size).to(device)
            self.basis = matrix_form(size, size, code_bits, code_group_size).to(device) if basis else None
            self.exact_rows = (
                matrix_form(exact_tokens, size, code_bits, code_group_size).to(device) if exact_tokens else None
            )
        else:
            # optional output-aware basis P (d×d): vector = train @ P; the trains live in the basis P⁻¹ (see tt_basis)
            self.register_buffer("basis", torch.eye(size, device=device, dtype=dtype) if basis else None)
            # optional exact tokens: their vectors are stored dense (exact_rows[slot]); exact_slot[t] = slot or -1
            self.exact_rows = (
                nn.Parameter(torch.zeros(exact_tokens, size, device=device, dtype=dtype)) if exact_tokens else None
            )
            bounds = [1, *ranks, 1]
            self.cores = nn.ParameterList(
                nn.Parameter(
                    torch.zeros(num_embeddings, bounds[k], shape[k], bounds[k + 1], device=device, dtype=dtype)
                )
                for k in range(len(shape))
            )
        self._split_cache: tuple | None = None  # see _token_split
        self._blocks_cache: tuple | None = None  # see _token_blocks

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A random train per token, every token at the stored ranks, in the identity basis, no exact tokens: the
        init of a layer no checkpoint filled. Each core is N(0, σ²) with ``σ^(2N) · Π r_k = 1``, so vectors have
        unit variance like ``nn.Embedding``'s N(0, 1) rows."""
        order = len(self.shape)
        std = math.prod(self.ranks) ** (-1.0 / (2 * order))
        self.token_ranks.copy_(torch.tensor(self.ranks, dtype=torch.int32).expand_as(self.token_ranks))
        if self.exact_rows is not None:
            self.exact_slot.fill_(-1)
        if self.code_bits is None:
            for core in self.cores:
                nn.init.normal_(core, 0.0, std)
            if self.basis is not None:
                self.basis.copy_(torch.eye(self.embedding_dim))
            if self.exact_rows is not None:
                nn.init.zeros_(self.exact_rows)
            return
        device, bounds = self.token_ranks.device, [1, *self.ranks, 1]
        cores = [
            torch.randn(self.num_embeddings, bounds[k], size, bounds[k + 1], device=device) * std
            for k, size in enumerate(self.shape)
        ]
        fresh = [(self.trains, stored_trains(cores, self.code_bits, self.code_group_size))]
        if self.basis is not None:
            eye = torch.eye(self.embedding_dim, device=device)
            fresh.append((self.basis, stored_matrix(eye, self.code_bits, self.code_group_size)))
        if self.exact_rows is not None:
            zeros = torch.zeros(self.exact_rows.shape, device=device)
            fresh.append((self.exact_rows, stored_matrix(zeros, self.code_bits, self.code_group_size)))
        for stored, new in fresh:
            stored.copy_(new)

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
    def store_codes(self, bits: int, group_size: int | None = None) -> TTEmbedding:
        """Hold the trains, exact rows and basis as ``bits``-bit codes from now on (in memory and in checkpoints),
        in place; e.g. after ``heal_tt_embedding``, which trains float cores. Everything is encoded before anything
        is replaced, so a bad setting leaves the layer as it was."""
        if self.code_bits is not None:
            raise ValueError(f"this TT layer already stores {self.code_bits}-bit codes; build it from float storage")
        check_code_storage(bits, group_size, self.embedding_dim)
        trains = stored_trains(list(self.cores), bits, group_size)
        basis = None if self.basis is None else stored_matrix(self.basis, bits, group_size)
        exact = None if self.exact_rows is None else stored_matrix(self.exact_rows, bits, group_size)
        del self.exact_rows  # a Parameter's name takes no module
        self.cores, self.trains, self.basis, self.exact_rows = None, trains, basis, exact
        self.code_bits, self.code_group_size = bits, group_size
        self._split_cache = self._blocks_cache = None
        return self

    # ------------------------------------------------------------------ stored form → float values
    def _dtype(self) -> torch.dtype:
        return self.dtype_probe.dtype

    def _token_cores(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The cores ``(n, R_{k-1}, I_k, R_k)`` of tokens ``ids``: gathered, or decoded from their codes."""
        if self.code_bits is None:
            return [core.index_select(0, ids) for core in self.cores]
        return unpack_rows(self.trains.rows(ids, self._dtype()), self.shape, self.ranks)

    def _train_vectors(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The ``(n, d)`` trains of tokens ``ids`` (all if None) before the basis; low-bit storage decodes them a
        block of tokens at a time."""
        if self.code_bits is None:
            return tt_reconstruct(list(self.cores), ids)
        if ids is None:
            ids = torch.arange(self.num_embeddings, device=self.token_ranks.device)
        if len(ids) <= RECONSTRUCT_BLOCK:
            return tt_reconstruct(self._token_cores(ids))
        out = self.dtype_probe.new_empty(len(ids), self.embedding_dim)
        for start in range(0, len(ids), RECONSTRUCT_BLOCK):
            block = slice(start, start + RECONSTRUCT_BLOCK)
            out[block] = tt_reconstruct(self._token_cores(ids[block]))
        return out

    def _basis_matrix(self) -> torch.Tensor | None:
        """``P`` (``d×d``, decoded whole in low-bit storage: a transient of ``d²`` values), or None."""
        if self.basis is None or self.code_bits is None:
            return self.basis
        return self.basis.dequantize(self._dtype())

    def _exact_lookup(self, slots: torch.Tensor) -> torch.Tensor:
        """Exact rows at ``slots``."""
        if self.code_bits is None:
            return self.exact_rows.index_select(0, slots)
        return self.exact_rows.rows(slots, self._dtype())

    def _exact_linear(self, raw: torch.Tensor) -> torch.Tensor:
        """``raw @ exact_rowsᵀ``, the rows as stored (decoded a chunk at a time in low-bit storage)."""
        return F.linear(raw, self.exact_rows) if self.code_bits is None else self.exact_rows.matmul_t(raw)

    def stored_tensors(self) -> list[torch.Tensor]:
        """The tensors holding the trains (cores, or codes, scales and minima): a derived copy is valid while these
        are unchanged (``TensorsState``)."""
        return list(self.cores) if self.code_bits is None else list(self.trains.buffers())

    def check_state(self) -> None:
        """Every token's ranks lie within the stored ones, and exact slots (``-1``: none) are distinct rows of
        ``exact_rows``: an index out of range would fail the first lookup or read another token's row."""
        if self.token_ranks.is_meta:
            return
        if self.ranks:
            low = self.token_ranks < 1
            high = self.token_ranks > torch.tensor(
                self.ranks, dtype=self.token_ranks.dtype, device=self.token_ranks.device
            )
            if (low | high).any():
                token = int((low | high).any(dim=1).nonzero()[0])
                raise TensorProblem(
                    "token_ranks",
                    f"gives token {token} ranks {self.token_ranks[token].tolist()}, outside 1..{self.ranks}",
                )
        if self.exact_rows is None:
            return
        count = self.exact_rows.shape[0]
        slots = self.exact_slot.long()
        if ((slots < -1) | (slots >= count)).any():
            raise TensorProblem("exact_slot", f"holds a slot outside -1..{count - 1}")
        used = slots[slots >= 0]
        if len(used.unique()) != len(used):
            raise TensorProblem("exact_slot", "gives two tokens the same exact row")

    # ------------------------------------------------------------------ model integration
    def bind(self, model: nn.Module) -> None:
        """Called once the layer sits in ``model``: take over the tied output layer (or untie it).

        transformers ties ``lm_head.weight`` to the embedding's ``weight`` parameter, which no longer exists, so
        the config's tying is switched off; a tied model gets a ``TTTiedHead`` reading this layer's cores.
        """
        untie_word_embeddings(model)
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
            model.set_submodule(self.tied_output, head.to_empty(device=self.token_ranks.device).to(self._dtype()))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        vectors = self._apply_basis(self._train_vectors(flat))
        if self.exact_rows is not None:
            slot = self.exact_slot[flat].long()
            exact = self._exact_lookup(slot.clamp(min=0))
            vectors = torch.where((slot >= 0)[:, None], exact, vectors)
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def _apply_basis(self, trains: torch.Tensor) -> torch.Tensor:
        basis = self._basis_matrix()
        return trains if basis is None else trains @ basis

    def __getstate__(self) -> dict:
        """Pickled without the decoding caches (they hold weak references, and are rebuilt on use)."""
        return {**super().__getstate__(), "_split_cache": None, "_blocks_cache": None}

    def _token_blocks(self, ids: torch.Tensor | None) -> list[list[torch.Tensor]] | None:
        """The train tokens' cores laid out for ``factored_logits``. Float storage keeps them between decoding
        steps while the cores and ``ids`` are unchanged (the size of those cores; transposing them per step cost a
        sixth of a step), and builds them per call (None) while the cores train: the layout must follow their
        gradients. Low-bit storage decodes them a block at a time on every call (a float copy is what it avoids)."""
        if self.code_bits is not None:
            ids = torch.arange(self.num_embeddings, device=self.token_ranks.device) if ids is None else ids
            return (
                token_minor_blocks(self._token_cores(ids[start : start + FACTORED_BLOCK]))[0]
                for start in range(0, len(ids), FACTORED_BLOCK)
            )
        if torch.is_grad_enabled() and any(core.requires_grad for core in self.cores):
            self._blocks_cache = None
            return token_minor_blocks(list(self.cores), ids)
        sources = [*self.cores] + ([] if ids is None else [ids])
        if self._blocks_cache is None or not self._blocks_cache[0].matches(sources):
            self._blocks_cache = None  # free the old layout before building the new one
            self._blocks_cache = (TensorsState(sources), token_minor_blocks(list(self.cores), ids))
        return self._blocks_cache[1]

    @property
    def weight(self) -> torch.Tensor:
        """The whole ``(V, d)`` embedding matrix, reconstructed (differentiable w.r.t. the cores)."""
        weight = self._apply_basis(self._train_vectors())
        exact = self._exact()
        return weight if exact is None else weight.index_copy(0, exact[0], exact[1])

    @property
    def num_embeddings(self) -> int:
        return self.token_ranks.shape[0]

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
        } | ({} if self.code_bits is None else {"code_bits": self.code_bits, "code_group_size": self.code_group_size})

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
            code_bits=spec.get("code_bits"),
            code_group_size=spec.get("code_group_size"),
        )

    # ------------------------------------------------------------------ size and cost
    def dense_parameters(self) -> int:
        """Parameters of the ``nn.Embedding`` this layer replaces (a tied output layer shares them)."""
        return self.num_embeddings * self.embedding_dim

    def stored_parameters(self) -> int:
        """Stored values (floats or codes; ``storage_bits`` counts their bytes, scales included)."""
        return self.num_embeddings * sum(core_sizes(self.shape, self.ranks)) + self._basis_parameters()

    def _basis_parameters(self) -> int:
        """The basis matrix and the dense rows of exact tokens (their trains are still stored and counted)."""
        exact = 0 if self.exact_rows is None else self.exact_rows.shape[0]
        return (0 if self.basis is None else self.embedding_dim**2) + exact * self.embedding_dim

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
        codes = (
            "" if self.code_bits is None else f", code_bits={self.code_bits}, code_group_size={self.code_group_size}"
        )
        return f"{self.num_embeddings}, {self.embedding_dim}, shape={self.shape}, ranks={self.ranks}, eps={self.eps}{codes}"
