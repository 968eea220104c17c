"""The tiered low-bit token embedding (``method="tiered"``) and the tied output layer that reads it.

Ships inside saved checkpoints: torch only. Tokens are split into tiers (e.g. the most frequent ones first), each
tier's rows stored as a ``LowBitTensor`` at its own bit width; an optional low-rank part ``left @ right`` is added
to the last tier's rows (a plain low-rank tail when that tier stores nothing, or a correction of its low-bit
quantization). Lookups decode only the requested rows; the tied head decodes the table a chunk at a time.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable

import torch
from torch import nn

from ...runtime.codebook import CodebookTensor
from ...runtime.contract import CompressedLayer, TensorProblem, TiedHead, untie_word_embeddings
from ...runtime.lowbit import LowBitTensor
from ...runtime.optional import sibling

#: What a tier may store (``methods/tiered/config.py: TIER_BITS``, which this shipped file cannot import).
TIER_WIDTHS = (0, 2, 3, 4, 8, 16, "codebook")

#: Hidden states from which the head decodes its rows in token order for a GEMM (prefill, scoring, a batch of many
#: sequences): one decode of the table serves them all, and the scores land in token order without a permutation
#: of the whole ``(positions, vocabulary)`` result. Fewer (a decoding step) read the packed tiers directly.
GEMM_POSITIONS = 16

#: Tokens whose rows the GEMM path decodes at a time: a reused block (512 × 576 fp32 is 1.2 MB) that the GEMM reads
#: back from the cache, where a block of 4,096 rows of a 2,048-wide model (34 MB) went out to memory and back.
GEMM_TOKENS = 512

#: What ``_places_in`` answers: for each tier holding some of the tokens, its index in ``tiers`` (``LOW_RANK``
#: for the low-rank part), the tokens' rows in it and their places among the tokens asked for.
LOW_RANK = -1
Places = list[tuple[int, torch.Tensor, torch.Tensor]]


def where_every_tier(
    slot: torch.Tensor,
    tiers: list[tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]],
    width: int,
    dtype: torch.dtype,
    low_rank: tuple[int, Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> torch.Tensor:
    """The rows at stored positions ``slot``, with no data-dependent shapes: each ``(start, end, decode)`` tier
    decodes a clamped row for every token and a ``where`` keeps the tokens in ``[start, end)``; ``low_rank``'s
    ``(start, decode)`` rows are added from ``start`` on. The form an accelerator and an exported graph both need."""
    vectors = torch.zeros(slot.shape[0], width, dtype=dtype, device=slot.device)
    for start, end, decode in tiers:
        rows = decode((slot - start).clamp(0, end - start - 1))
        vectors = torch.where(((slot >= start) & (slot < end))[:, None], rows, vectors)
    if low_rank is not None:
        start, decode = low_rank
        vectors = vectors + torch.where((slot >= start)[:, None], decode((slot - start).clamp(min=0)), 0.0)
    return vectors


def _as_float32(value: float) -> float:
    """``value`` rounded to fp32, as ``torch.tensor(value, dtype=torch.float32)`` holds it, without building a tensor
    (a lookup of a few tokens takes a few microseconds, and a tensor costs about two)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_tiers(
    num_embeddings: int, embedding_dim: int, tiers: list[dict], rank: int, rank_bits: int, tied_output: str | None
) -> None:
    """A ``TieredEmbedding``'s structure as ``TieredConfig.validate`` allows it (a hand-edited spec would otherwise
    build a layer whose rows are zero or garbage): ValueError naming the field and what would be right."""
    if not (_count(num_embeddings) and num_embeddings >= 1 and _count(embedding_dim) and embedding_dim >= 1):
        raise ValueError(f"num_embeddings={num_embeddings!r} and embedding_dim={embedding_dim!r} must be ints >= 1")
    if not isinstance(tiers, list) or not tiers or not all(isinstance(tier, dict) for tier in tiers):
        raise ValueError(f"tiers must be a non-empty list of dicts, got {tiers!r}")
    for index, tier in enumerate(tiers):
        rows, bits = tier.get("rows"), tier.get("bits")
        if not _count(rows) or rows < 1:
            raise ValueError(f"tiers[{index}]['rows'] = {rows!r} must be an int >= 1")
        if isinstance(bits, bool) or bits not in TIER_WIDTHS:
            raise ValueError(f"tiers[{index}]['bits'] = {bits!r} must be one of {list(TIER_WIDTHS)}")
    if sum(tier["rows"] for tier in tiers) != num_embeddings:
        raise ValueError(f"tiers {tiers} do not add up to the {num_embeddings} tokens")
    if not _count(rank) or rank < 0:
        raise ValueError(f"rank={rank!r} must be an int >= 0 (0: no low-rank part)")
    if rank and (isinstance(rank_bits, bool) or rank_bits not in (8, 16)):
        raise ValueError(f"rank_bits={rank_bits!r} must be 8 or 16")
    if any(tier["bits"] == 0 for tier in tiers[:-1]) or (tiers[-1]["bits"] == 0 and not rank):
        raise ValueError("bits=0 (rows from the low-rank part alone) is for the last tier and needs rank >= 1")
    if tied_output is not None and (not isinstance(tied_output, str) or not tied_output):
        raise ValueError(f"tied_output={tied_output!r} must be the output layer's module name or null")


def tier_storage(tier: dict, columns: int) -> LowBitTensor | CodebookTensor:
    """The empty storage of one tier's rows, as its spec says."""
    if tier["bits"] == "codebook":
        return CodebookTensor((tier["rows"], columns), tier["codebook_dim"], tier["codebook_size"])
    return LowBitTensor((tier["rows"], columns), tier["bits"], tier["group_size"])


class TieredEmbedding(CompressedLayer):
    """``nn.Embedding`` replacement whose rows are stored tier by tier in low-bit form.

    ``slot[token]`` is the token's row in the stored order (tiers one after the other); ``tiers`` describes each
    tier as ``{"rows", "bits", "group_size"}`` (``bits=0``: the last tier stores nothing but its low-rank part;
    ``bits="codebook"``: vector-quantized rows, with ``"codebook_dim"`` and ``"codebook_size"``)."""

    layer_type = "tiered_embedding"

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        tiers: list[dict],
        rank: int = 0,
        rank_bits: int = 8,
        tied_output: str | None = None,
    ) -> None:
        super().__init__()
        check_tiers(num_embeddings, embedding_dim, tiers, rank, rank_bits, tied_output)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tier_specs = [dict(tier) for tier in tiers]
        self.rank, self.rank_bits, self.tied_output = rank, rank_bits, tied_output
        self.register_buffer("slot", torch.arange(num_embeddings, dtype=torch.int32))
        self.tiers = nn.ModuleList(tier_storage(tier, embedding_dim) for tier in tiers if tier["bits"])
        self.low_rank_start = num_embeddings - tiers[-1]["rows"]  # the low-rank part serves the last tier
        if rank:
            self.left = LowBitTensor((num_embeddings - self.low_rank_start, rank), rank_bits)
            self.right = LowBitTensor((rank, embedding_dim), rank_bits)
        self.register_buffer("dtype_probe", torch.zeros(0), persistent=False)  # follows the model's dtype
        # _decoder's: the buffers, their addresses, the decode built for them
        self._decoder_of: tuple[list[torch.Tensor], list[int], Callable[..., bool]] | None = None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random rows (N(0, 1), like ``nn.Embedding``) in every tier and factor, tokens in id order."""
        self.slot.copy_(torch.arange(self.num_embeddings, dtype=torch.int32))
        for stored in [*self.tiers, *([self.left, self.right] if self.rank else [])]:
            if isinstance(stored, CodebookTensor):
                stored.reset_parameters()
                continue
            stored.copy_(
                LowBitTensor.quantize(
                    torch.randn(stored.shape, device=stored.codes.device), stored.bits, stored.group_size
                )
            )

    def check_state(self) -> None:
        """``slot`` maps the tokens one to one onto the stored rows (a permutation of 0..V-1): a duplicate would
        give two tokens one row, a value out of range fail the first lookup."""
        if self.slot.is_meta:
            return
        slot = self.slot.long()
        bad = ((slot < 0) | (slot >= self.num_embeddings)).nonzero()
        if len(bad):
            token = int(bad[0])
            raise TensorProblem(
                "slot", f"maps token {token} to row {int(slot[token])}, outside 0..{self.num_embeddings - 1}"
            )
        counts = torch.bincount(slot, minlength=self.num_embeddings)
        if (counts != 1).any():
            row = int((counts > 1).nonzero()[0])
            raise TensorProblem("slot", f"maps {int(counts[row])} tokens to row {row}: it must be a permutation")

    def _ranges(self) -> list[tuple[int, int]]:
        """(start, end) in the stored order of every tier that stores rows."""
        ranges, start = [], 0
        for tier in self.tier_specs:
            if tier["bits"]:
                ranges.append((start, start + tier["rows"]))
            start += tier["rows"]
        return ranges

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(input_ids)

    def lookup(self, input_ids: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """The stored rows of ``input_ids`` (what the replaced ``nn.Embedding`` looked up), times ``scale`` where
        given (a scaled embedding's: the product in the model's dtype, as the replaced module computes it)."""
        # the buffers read from their dict: Module.__getattr__ costs about half a microsecond a name, and the lookup
        # of a few tokens takes a few microseconds in all
        slot, dtype = self._buffers["slot"], self._buffers["dtype_probe"].dtype
        tokens, cpu = input_ids.reshape(-1), slot.is_cpu
        # the C decode multiplies each fp32 row as it is written; in another dtype, or with a low-rank part still to
        # add, the product is taken afterwards, where the replaced module takes it
        fused = scale is not None and cpu and dtype == torch.float32 and not self.rank
        factor = _as_float32(scale) if fused else 1.0
        if not cpu:
            vectors = self._lookup_every_tier(slot[tokens].long(), dtype)
        elif self._decode_all_tiers(tokens, vectors := torch.empty((tokens.shape[0], self.embedding_dim)), factor):
            if dtype != torch.float32:
                vectors = vectors.to(dtype)  # decoded in fp32 (a copy for a bf16 model, and rows are few)
        else:
            vectors, fused = torch.zeros(len(tokens), self.embedding_dim, dtype=dtype), False
            self._decode_places(self._places_in(slot[tokens].long()), vectors)
        if scale is not None and not fused:
            vectors = vectors * torch.tensor(scale, dtype=torch.float32).to(dtype)  # as the replaced module holds it
        return vectors.reshape(*input_ids.shape, self.embedding_dim)

    def _decode_all_tiers(self, tokens: torch.Tensor | range, out: torch.Tensor, factor: float = 1.0) -> bool:
        """CPU: the rows of ``tokens`` (ids, or a range of them) into fp32 ``out`` in one C call across every tier
        (the kernel's ``tier_decoder``), each times ``factor`` (only without a low-rank part), then the
        low-rank part added; False (nothing written) where the checkpoint has no kernel or it does not cover every
        tier's layout. Tier by tier, each call from Python would cost about what decoding a few hundred rows does."""
        decode = self._decoder()
        if decode is None or not decode(tokens, out, factor):
            return False
        if self.rank:
            slot = self.slot[tokens.start : tokens.stop] if isinstance(tokens, range) else self.slot[tokens]
            self._decode_places(self._low_rank_places(slot.long()), out)
        return True

    def _lookup_every_tier(self, slot: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows of ``slot`` without finding each tier's tokens first (``where_every_tier``): more decoding than
        the CPU path, but no ``nonzero``, whose result size makes an accelerator wait for the host once per tier and
        step."""
        tiers = [
            (start, end, lambda index, s=stored: s.rows(index, dtype))
            for stored, (start, end) in zip(self.tiers, self._ranges())
        ]
        low_rank = None
        if self.rank:
            low_rank = (self.low_rank_start, lambda index: self.left.rows(index, dtype) @ self.right.dequantize(dtype))
        return where_every_tier(slot, tiers, self.embedding_dim, dtype, low_rank)

    def _decoder(self) -> Callable[..., bool] | None:
        """The kernel's decode of every tier (``tier_decoder``; None where the checkpoint has no kernel or a tier's
        layout is not covered). Built, with its checks, once for each set of stored tensors (``slot`` and the tiers')
        at their addresses: the C code reads them where they are, so values changed in place need nothing new, while
        a replaced buffer (a load with ``assign``) is another tensor, and a copy of the layer (``deepcopy``, pickling)
        holds the same-named tensors at other addresses. ``to()`` drops it (``_apply``)."""
        # map() and the dicts, not a loop over attributes: this runs at every lookup, a few microseconds in all
        buffers = [self._buffers["slot"]]
        buffers += [buffer for stored in self._modules["tiers"] for buffer in stored._buffers.values()]
        kept = self._decoder_of
        if kept is not None and len(kept[0]) == len(buffers) and all(map(operator.is_, kept[0], buffers)):
            if kept[1] == list(map(torch.Tensor.data_ptr, buffers)):
                return kept[2]
        kernel = sibling("lowbit_kernel")
        if kernel is None:
            return None
        stored = iter(self.tiers)
        forms = [
            next(stored).kernel_form(kernel) if tier["bits"] else kernel.zero_form(tier["rows"], self.embedding_dim)
            for tier in self.tier_specs
        ]
        table = kernel.tier_table(forms, self.embedding_dim)
        decode = None if table is None else kernel.tier_decoder(buffers[0], table, forms)  # it holds the forms
        contiguous = all(buffer.is_contiguous() for buffer in buffers)  # else a form points at a copy
        held = (buffers, list(map(torch.Tensor.data_ptr, buffers)), decode)
        self._decoder_of = held if decode is not None and contiguous else None
        return decode

    def __getstate__(self) -> dict:
        """What pickling keeps: everything but the decode, which calls this process's kernel on its tensors."""
        return {**super().__getstate__(), "_decoder_of": None}

    def _apply(self, fn: Callable, recurse: bool = True) -> TieredEmbedding:
        self._decoder_of = None  # the decode points at the tensors ``to()`` replaces (and would keep them alive)
        return super()._apply(fn, recurse)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden @ Wᵀ`` in token order, decoding the table a chunk at a time (no float copy of the table): for
        ``GEMM_POSITIONS`` or more hidden states, ``GEMM_TOKENS`` tokens' rows at a time in token order for a GEMM;
        for fewer, each tier through its own product (the fused CPU kernels where the checkpoint carries them), the
        scores then put in token order."""
        if hidden.numel() >= GEMM_POSITIONS * hidden.shape[-1]:
            return self._logits_by_token(hidden)
        parts = []
        stored = iter(self.tiers)
        for tier in self.tier_specs:
            parts.append(
                next(stored).matmul_t(hidden) if tier["bits"] else hidden.new_zeros(*hidden.shape[:-1], tier["rows"])
            )
        scores = torch.cat(parts, dim=-1)
        if self.rank:
            scores[..., self.low_rank_start :] += self.left.matmul_t(hidden @ self.right.dequantize(hidden.dtype).T)
        return scores.index_select(-1, self.slot.long())

    def _logits_by_token(self, hidden: torch.Tensor) -> torch.Tensor:
        """``logits`` for many hidden states: each chunk of tokens' rows decoded into one reused block
        (``decode_tokens``), multiplied into that chunk's columns of the result."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        scores = flat.new_empty(len(flat), self.num_embeddings)
        decoded = torch.float32 if flat.device.type == "cpu" else flat.dtype  # the C decode writes fp32
        block = flat.new_empty(min(GEMM_TOKENS, self.num_embeddings), self.embedding_dim, dtype=decoded)
        for start in range(0, self.num_embeddings, GEMM_TOKENS):
            rows = self.decode_tokens(start, min(start + GEMM_TOKENS, self.num_embeddings), block)
            scores[:, start : start + len(rows)] = flat @ rows.to(flat.dtype).T
        return scores.reshape(*hidden.shape[:-1], self.num_embeddings)

    def decode_tokens(self, start: int, end: int, block: torch.Tensor) -> torch.Tensor:
        """The rows of tokens ``start`` … ``end - 1``, in token order, decoded into ``block`` (in its dtype) tier by
        tier (``decode_into``: in C where the kernel covers the tier)."""
        if not 0 <= start < end <= self.num_embeddings or len(block) < end - start:
            raise ValueError(f"tokens {start}..{end - 1} need a block of {end - start} rows within the vocabulary")
        rows = block[: end - start]
        if self.slot.device.type != "cpu":
            return rows.copy_(self._lookup_every_tier(self.slot[start:end].long(), rows.dtype))
        if self._decode_all_tiers(range(start, end), rows):
            return rows
        if any(tier["bits"] == 0 for tier in self.tier_specs):
            rows.zero_()  # those rows are the low-rank part alone
        return self._decode_places(self._places_in(self.slot[start:end].long()), rows)

    def _decode_places(self, where: Places, out: torch.Tensor) -> torch.Tensor:
        """``out`` (zeros where only the low-rank part serves) with each token's row decoded at its place, tier by
        tier; the places come from ``_places_in``, so they are in range and the C decode need not look."""
        for tier, ids, places in where:
            if tier == LOW_RANK:
                out[places] += self.left.rows(ids, out.dtype) @ self.right.dequantize(out.dtype)
            else:
                self.tiers[tier].decode_into(ids, out, places, in_range=True)
        return out

    def _places_in(self, slot: torch.Tensor) -> Places:
        """Where the tokens at stored rows ``slot`` sit: for each tier holding some, their rows in it and their
        places in ``slot`` (both in range by construction)."""
        places = []
        for tier, (first, last) in enumerate(self._ranges()):
            hit = ((slot >= first) & (slot < last)).nonzero().squeeze(1)
            if len(hit):
                places.append((tier, slot[hit] - first, hit))
        return places + self._low_rank_places(slot)

    def _low_rank_places(self, slot: torch.Tensor) -> Places:
        """``_places_in`` for the low-rank part alone (none without one)."""
        hit = (slot >= self.low_rank_start).nonzero().squeeze(1) if self.rank else slot[:0]
        return [(LOW_RANK, slot[hit] - self.low_rank_start, hit)] if len(hit) else []

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(V, d)`` matrix, rebuilt (for code that asks for it; forward and logits never build it)."""
        return self.lookup(torch.arange(self.num_embeddings, device=self.slot.device))

    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None) -> TieredEmbedding:
        """``resize_token_embeddings``: the same size is a no-op; another size is refused (rows are packed per tier,
        and a new token's tier and rounding need the calibration the layer was built with)."""
        target = new_num_tokens or self.num_embeddings
        if pad_to_multiple_of:
            target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
        if target != self.num_embeddings:
            raise ValueError(
                f"a tiered embedding cannot change its vocabulary ({self.num_embeddings} -> {target}): resize the dense "
                "model's token embeddings first (resize_token_embeddings), then compress it with method='tiered'"
            )
        return self

    def bind(self, model: nn.Module) -> None:
        """Take over the tied output layer: its weight parameter is gone, so tying is switched off and the head
        reads this layer."""
        untie_word_embeddings(model)
        if self.tied_output is not None:
            model.set_submodule(self.tied_output, TieredTiedHead(self))

    def unbind(self, model: nn.Module, reference: nn.Module) -> None:
        """``decompress``: the tied head goes back to the dense output layer (tied again by the caller)."""
        if self.tied_output is not None:
            head = reference.get_submodule(self.tied_output)
            model.set_submodule(self.tied_output, head.to_empty(device=self.slot.device).to(self.dtype_probe.dtype))

    def spec(self) -> dict:
        return {
            "type": self.layer_type,
            "num_embeddings": self.num_embeddings,
            "embedding_dim": self.embedding_dim,
            "tiers": self.tier_specs,
            "rank": self.rank,
            "rank_bits": self.rank_bits,
            "tied_output": self.tied_output,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> TieredEmbedding:
        return cls(
            spec["num_embeddings"],
            spec["embedding_dim"],
            spec["tiers"],
            spec.get("rank", 0),
            spec.get("rank_bits", 8),
            spec.get("tied_output"),
        )

    def dense_parameters(self) -> int:
        return self.num_embeddings * self.embedding_dim

    def stored_parameters(self) -> int:
        """Stored values (codes and factor entries), whatever their width; ``storage_bits`` counts the bytes."""
        return sum(s.shape[0] * s.shape[1] for s in [*self.tiers, *([self.left, self.right] if self.rank else [])])

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        return tokens * self.rank * self.embedding_dim, "lookup"

    def extra_repr(self) -> str:
        def described(tier: dict) -> str:
            if tier["bits"] == "codebook":
                return f"{tier['rows']}×codebook{tier['codebook_size']}/d{tier['codebook_dim']}"
            return f"{tier['rows']}×int{tier['bits']}" + (
                f"/g{tier['group_size']}" if tier["bits"] not in (0, 16) else ""
            )

        tiers = ", ".join(described(tier) for tier in self.tier_specs)
        return f"{self.num_embeddings}, {self.embedding_dim}, tiers=[{tiers}], rank={self.rank}"


class TieredTiedHead(TiedHead):
    """The tied output layer of a model whose embedding is a ``TieredEmbedding``: ``logits = h Wᵀ`` decoded chunk
    by chunk from the low-bit rows."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.embedding.logits(hidden)
