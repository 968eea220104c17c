"""Stored matrices decoded inside the exported graph: packed codes stay uint8 initializers, and the graph unpacks them
with integer ``Div`` and ``Mod`` (``bits_at``), then scales them, for exactly the rows it needs.

Export-only code (torch ops that the dynamo exporter translates one to one, and the contrib ops of ``ortops.py``
where a storage maps onto ONNX Runtime's own kernels); the layouts are those of
``runtime/lowbit.py`` (``pack``) and ``runtime/codebook.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.codebook import CodebookTensor
from ...runtime.lowbit import LowBitTensor
from .ortops import GATHER_BITS, MATMUL_BITS, block_fits, gather_block_quantized, matmul_nbits


def bits_at(values: torch.Tensor, shift: int, width: int) -> torch.Tensor:
    """Bits ``shift … shift + width − 1`` of int32 ``values`` as ``Div`` and ``Mod`` (ONNX's ``BitShift`` takes
    unsigned types only, and the exporter types a uint8 shift's result as int8, which ONNX Runtime refuses)."""
    return torch.remainder(torch.floor_divide(values, 2**shift), 2**width)


def unpack_codes(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """``(rows, bytes)`` uint8 → ``(rows, columns)`` int32 codes, the inverse of ``lowbit.pack`` in graph ops."""
    wide = packed.to(torch.int32)
    if bits == 8:
        return wide[:, :columns]
    if bits in (2, 4):
        parts = [bits_at(wide, shift, bits) for shift in range(0, 8, bits)]
    else:  # 3 bits: 8 codes in 3 little-endian bytes (lowbit.unpack)
        low, mid, high = wide[:, 0::3], wide[:, 1::3], wide[:, 2::3]
        parts = [
            bits_at(low, 0, 3),
            bits_at(low, 3, 3),
            bits_at(low, 6, 2) + bits_at(mid, 0, 1) * 4,
            bits_at(mid, 1, 3),
            bits_at(mid, 4, 3),
            bits_at(mid, 7, 1) + bits_at(high, 0, 2) * 2,
            bits_at(high, 2, 3),
            bits_at(high, 5, 3),
        ]
    return torch.stack(parts, dim=-1).reshape(packed.shape[0], -1)[:, :columns]


class GraphLowBit(nn.Module):
    """A ``LowBitTensor``'s buffers (the same tensors) with a forward the exporter traces: ``rows(ids)`` gathers the
    packed rows first and decodes only those, ``values()`` decodes all (small factors), ``matmul_t(x)`` is
    ``x @ Wᵀ``. With ``ort_ops`` set (by ``export_onnx``), the widths and groups ONNX Runtime's quantized kernels take
    run on them (``ortops.py``): a lookup on ``GatherBlockQuantized``, a product on ``MatMulNBits``."""

    #: Map the storage onto ONNX Runtime's contrib ops where it fits (set on the instances by ``export_onnx``).
    ort_ops = False

    def __init__(self, stored: LowBitTensor) -> None:
        super().__init__()
        self.shape, self.bits, self.group_size = stored.shape, stored.bits, stored.group_size
        for name, buffer in stored.named_buffers():
            self.register_buffer(name, buffer)

    def _maps(self, widths: tuple[int, ...]) -> bool:
        return self.ort_ops and self.bits in widths and block_fits(self.group_size, self.shape[1])

    def _offset(self) -> torch.Tensor:
        """What the contrib ops' decode ``(code − 2^(bits−1)) · scale`` lacks of ``code · scale + minimum``, per
        group."""
        return self.minimum.float() + 2 ** (self.bits - 1) * self.scale.float()

    def _contrib_rows(self, ids: torch.Tensor) -> torch.Tensor:
        rows = gather_block_quantized(self.codes, ids, self.scale.float(), self.shape[1], self.bits)
        return rows + self._offset()[ids].repeat_interleave(self.group_size, dim=1)

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ Wᵀ``: on ``MatMulNBits`` plus the per-group offsets where it maps, else with the decoded ``W``."""
        if not self._maps(MATMUL_BITS):
            return x @ self.values().T
        product = matmul_nbits(x, self.codes, self.scale.float(), self.shape[1], self.bits)
        group_sums = x.reshape(*x.shape[:-1], -1, self.group_size).sum(dim=-1)
        return product + group_sums @ self._offset().T

    def _decode(self, codes: torch.Tensor, scale: torch.Tensor | None, minimum: torch.Tensor | None) -> torch.Tensor:
        if self.bits == 16:
            return codes.float()
        rows = codes.shape[0]
        values = unpack_codes(codes, self.bits, self.shape[1]).float().reshape(rows, -1, self.group_size)
        return (values * scale.float()[..., None] + minimum.float()[..., None]).reshape(rows, self.shape[1])

    def values(self) -> torch.Tensor:
        if self._maps(GATHER_BITS):
            return self._contrib_rows(torch.arange(self.shape[0]))
        return self._decode(self.codes, getattr(self, "scale", None), getattr(self, "minimum", None))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.bits == 16:
            return self.codes[ids].float()
        if self._maps(GATHER_BITS):
            return self._contrib_rows(ids)
        return self._decode(self.codes[ids], self.scale[ids], self.minimum[ids])


class GraphCodebook(nn.Module):
    """A ``CodebookTensor``'s buffers with a traced decode: indices (low byte + packed high bits) → codebook ``Gather``
    → per-row scale."""

    def __init__(self, stored: CodebookTensor) -> None:
        super().__init__()
        self.shape, self.high_bits = stored.shape, stored.high_bits
        for name, buffer in stored.named_buffers():
            self.register_buffer(name, buffer)

    def _decode(self, codes: torch.Tensor, high: torch.Tensor | None, scale: torch.Tensor) -> torch.Tensor:
        indices = codes.long()
        if high is not None:
            indices = indices + unpack_codes(high, self.high_bits, codes.shape[1]).long() * 256
        vectors = self.codebook.float()[indices]  # (rows, columns / dim, dim)
        return vectors.reshape(codes.shape[0], self.shape[1]) * scale.float()

    def values(self) -> torch.Tensor:
        return self._decode(self.codes, getattr(self, "high", None), self.scale)

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.values().T

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        high = self.high[ids] if self.high_bits else None
        return self._decode(self.codes[ids], high, self.scale[ids])


def graph_form(stored: LowBitTensor | CodebookTensor) -> GraphLowBit | GraphCodebook:
    """The graph-decoded form of a stored matrix."""
    return GraphCodebook(stored) if isinstance(stored, CodebookTensor) else GraphLowBit(stored)
