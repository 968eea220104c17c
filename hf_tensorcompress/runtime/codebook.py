"""Vector-quantized storage of a matrix: every ``dim`` consecutive columns of a row are one index into a shared
codebook of ``entries`` vectors, and each row has its own fp16 scale.

Ships inside saved checkpoints (imports torch and sibling shipped files only). Below 3 bits a weight, scalar codes with group scales run out
of levels (int2 with a scale and minimum per 64 columns spends 2.5 bits a weight on 4 levels); a codebook of 1,024
4-vectors spends the same 2.5 bits on 1,024 joint values, fitted to where the rows actually lie. Rows are rebuilt as
``scale · [codebook[i₀], codebook[i₁], …]`` only for the rows a forward needs (``rows``) or a chunk at a time
(``matmul_t``). Indices are stored as their low byte (``codes``) plus, above 256 entries, their high bits packed
like ``LowBitTensor`` codes (``high``).
"""

from __future__ import annotations

from types import ModuleType

import torch

from .contract import TensorProblem, expect_tensor
from .lowbit import StoredMatrix, pack, unpack
from .optional import sibling

#: Codebook sizes a ``CodebookTensor`` stores (an index is a byte plus 0, 2, 3, 4 or 8 packed high bits).
CODEBOOK_SIZES = (256, 1024, 2048, 4096, 65536)


def check_codebook(dim: int, entries: int, columns: int) -> None:
    """A clear error for settings a ``CodebookTensor`` cannot store."""
    if entries not in CODEBOOK_SIZES:
        raise ValueError(f"codebook_size={entries!r} is not a stored size; choose one of {list(CODEBOOK_SIZES)}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1 or columns % dim:
        raise ValueError(f"codebook_dim={dim!r} must be a positive int dividing the {columns} columns")


class CodebookTensor(StoredMatrix):
    """A ``(rows, columns)`` matrix stored as codebook indices + one fp16 scale per row + the fp16 codebook
    (buffers of their final shapes, so ``CodebookTensor(shape, dim, entries)`` + ``load_state_dict`` restores one)."""

    def __init__(self, shape: tuple[int, int] | list[int], dim: int, entries: int) -> None:
        super().__init__()
        rows, columns = (int(size) for size in shape)
        check_codebook(dim, entries, columns)
        self.shape, self.dim, self.entries = (rows, columns), dim, entries
        self.high_bits = entries.bit_length() - 1 - 8
        vectors = columns // dim
        self.register_buffer("codes", torch.zeros(rows, vectors, dtype=torch.uint8))
        if self.high_bits:
            self.register_buffer("high", torch.zeros(rows, -(-vectors // 8) * self.high_bits, dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(rows, 1, dtype=torch.float16))
        self.register_buffer("codebook", torch.zeros(entries, dim, dtype=torch.float16))

    @torch.no_grad()
    def set_indices(self, indices: torch.Tensor, scale: torch.Tensor, codebook: torch.Tensor) -> CodebookTensor:
        """Store ``indices`` (``(rows, columns / dim)``, chosen elsewhere), per-row ``scale`` and ``codebook``."""
        indices = indices.to(torch.int64)
        self.codes.copy_((indices & 255).to(torch.uint8))
        if self.high_bits:
            self.high.copy_(pack((indices >> 8).to(torch.uint8), self.high_bits))
        self.scale.copy_(scale.reshape(-1, 1))
        self.codebook.copy_(codebook)
        return self

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random rows with N(0, 1) entries (like ``nn.Embedding``): a normal codebook, uniform indices, scale 1."""
        device = self.codes.device
        indices = torch.randint(self.entries, (self.shape[0], self.shape[1] // self.dim), device=device)
        self.set_indices(indices, torch.ones(self.shape[0], device=device), torch.randn(self.entries, self.dim))

    def spec(self) -> dict:
        return {"shape": list(self.shape), "codebook_dim": self.dim, "codebook_size": self.entries}

    def check_state(self) -> None:
        """Dtypes and shapes of the buffers, and zero padding in ``high``. Every index a byte plus ``high_bits``
        bits can hold is below the codebook size (``256 · 2^high_bits`` entries), so no stored index is out of
        range once the shapes are right."""
        rows, columns = self.shape
        vectors = columns // self.dim
        expect_tensor(self.codes, "codes", torch.uint8, (rows, vectors))
        expect_tensor(self.scale, "scale", torch.float16, (rows, 1))
        expect_tensor(self.codebook, "codebook", torch.float16, (self.entries, self.dim))
        if not self.high_bits:
            return
        expect_tensor(self.high, "high", torch.uint8, (rows, -(-vectors // 8) * self.high_bits))
        if vectors % 8 and rows and not self.high.is_meta:
            tail = unpack(self.high[:, -self.high_bits :], self.high_bits, 8)[:, vectors % 8 :]
            if tail.any():
                raise TensorProblem("high", f"holds index bits past the {vectors} indices of a row (padding is 0)")

    def _indices(self, rows: slice | torch.Tensor) -> torch.Tensor:
        indices = self._take(self.codes, rows).to(torch.int64)
        if self.high_bits:
            indices |= unpack(self._take(self.high, rows), self.high_bits, indices.shape[1]).to(torch.int64) << 8
        return indices

    def _decode(self, rows: slice | torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float values of ``rows`` (a slice or an index tensor), written into ``out`` when given."""
        indices = self._indices(rows)
        values = self.codebook.to(dtype).index_select(0, indices.reshape(-1)).reshape(len(indices), -1)
        scale = self._take(self.scale, rows).to(dtype)
        return torch.mul(values, scale, out=out)

    def kernel_form(self, kernel: ModuleType) -> tuple | None:
        """This matrix as a ``TierForm`` of the kernel's ``decode_tiers`` (None where the kernel does not cover it)."""
        high = self.high if self.high_bits else None
        return kernel.codebook_form(self.codes, high, self.high_bits, self.scale, self.codebook)

    def _decode_in_kernel(
        self, kernel, ids: torch.Tensor, out: torch.Tensor, places: torch.Tensor, in_range: bool
    ) -> bool:
        high = self.high if self.high_bits else None
        return kernel.decode_codebook_rows(
            self.codes, high, self.high_bits, self.scale, self.codebook, ids, out, places, in_range
        )

    def matmul_t(self, hidden: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """``hidden @ Wᵀ`` (``(..., columns) → (..., rows)``): on the CPU through the fused kernel (a lookup table
        for up to four hidden vectors, a C decode of 1,024 rows at a time for a GEMM beyond), else decoding ``chunk``
        rows (default ``chunk_rows``) at a time into one reused buffer; the transient is never the whole float
        table."""
        self.check_width(hidden)
        kernel = sibling("lowbit_kernel")
        fused = kernel and kernel.fused_codebook_matmul_t(
            self.codes, self.high if self.high_bits else None, self.high_bits, self.scale, self.codebook, hidden
        )
        if fused is not None:
            return fused
        return self._chunked_matmul_t(hidden, chunk)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, codebook_dim={self.dim}, codebook_size={self.entries}"
