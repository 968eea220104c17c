"""Stored matrices decoded inside the exported graph: packed codes stay uint8 initializers, and the graph unpacks them
with ``BitShift`` and ``BitwiseAnd`` (``unpack_codes``), then scales them, for exactly the rows it needs.

Export-only code (torch ops that the dynamo exporter translates one to one, and the contrib ops of ``ortops.py``
where a storage maps onto ONNX Runtime's own kernels); the layouts are those of
``runtime/lowbit.py`` (``pack``) and ``runtime/codebook.py``. Rows are picked with ``index_select`` (one ``Gather``;
the exporter writes ``tensor[ids]`` as eight nodes around a ``GatherND``). Ternary codes (five a byte) decode with one
``Gather`` from a 243 × 5 table of levels.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import opset21 as op
from torch import nn

from ...runtime.bit_packing import unpack_bits
from ...runtime.codebook import CodebookTensor
from ...runtime.lowbit import LowBitTensor, unpack
from ...runtime.ternary import TernaryTensor, level_table
from .ortops import GATHER_BITS, MATMUL_BITS, block_fits, gather_block_quantized, matmul_nbits


@torch.library.custom_op("hf_tensorcompress_onnx::unpack_codes", mutates_args=())
def unpack_codes(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """``(rows, bytes)`` uint8 → ``(rows, columns)`` int32 codes: the inverse of ``lowbit.pack`` (``bits`` 2, 3, 4,
    8) or of ``biprop.pack_bits`` (``bits`` 1). A custom op so that the graph gets the few nodes of
    ``_unpack_codes_onnx`` (the exporter's own integer division and remainder cost nine nodes a shift)."""
    if bits == 1:
        codes = unpack_bits(packed, packed.numel() * 8).reshape(packed.shape[0], -1)[:, :columns]
    else:
        codes = unpack(packed, bits, columns)
    return codes.to(torch.int32)


@unpack_codes.register_fake
def _(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    return packed.new_empty(packed.shape[0], columns, dtype=torch.int32)


def _constant(values: list[int], dtype: type) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(values, dtype=dtype)))


def _unpack_codes_onnx(packed, bits: int, columns: int):
    """Standard ops: each byte (for 3 bits, each 3-byte word) is shifted right by every code's offset at once
    (``BitShift`` broadcast over a trailing axis), masked, and the codes laid out row by row."""
    if bits == 8:
        codes = packed
    elif bits == 3:  # 8 codes in 3 little-endian bytes: the 24-bit word first
        triples = op.Cast(op.Reshape(packed, _constant([0, -1, 3], np.int64)), to=ir.DataType.INT32)
        word = op.ReduceSum(op.Mul(triples, _constant([1, 256, 65536], np.int32)), _constant([-1], np.int64))
        shifted = op.BitShift(op.Cast(word, to=ir.DataType.UINT32), _constant(list(range(0, 24, 3)), np.uint32),
                              direction="RIGHT")  # fmt: skip
        codes = op.BitwiseAnd(shifted, _constant([7], np.uint32))
    else:
        offsets = range(7, -1, -1) if bits == 1 else range(0, 8, bits)
        byte = op.Unsqueeze(packed, _constant([-1], np.int64))
        shifted = op.BitShift(byte, _constant(list(offsets), np.uint8), direction="RIGHT")
        codes = op.BitwiseAnd(shifted, _constant([2**bits - 1], np.uint8))
    codes = op.Reshape(codes, _constant([0, -1], np.int64))
    if columns % 8:  # the padding codes of the last byte group
        codes = op.Slice(codes, _constant([0], np.int64), _constant([columns], np.int64), _constant([1], np.int64))
    return op.Cast(codes, to=ir.DataType.INT32)


#: custom op → its standard-ops translation (``torch.onnx.export(custom_translation_table=...)``)
TRANSLATIONS = {torch.ops.hf_tensorcompress_onnx.unpack_codes.default: _unpack_codes_onnx}


class GraphLowBit(nn.Module):
    """A ``LowBitTensor``'s buffers (the same tensors) with a forward the exporter traces: ``rows(ids)`` gathers the
    packed rows first and decodes only those, ``values()`` decodes all (small factors), ``matmul_t(x)`` is
    ``x @ Wᵀ``. With ``ort_ops`` set (by ``export_onnx``), the widths and groups ONNX Runtime's quantized kernels take
    run on them (``ortops.py``): a lookup on ``GatherBlockQuantized``, a product on ``MatMulNBits`` (computing at
    ``accuracy_level``)."""

    #: Map the storage onto ONNX Runtime's contrib ops where it fits (set on the instances by ``export_onnx``).
    ort_ops = False
    accuracy_level = 0

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
        grouped = rows.reshape(ids.shape[0], -1, self.group_size) + self._offset().index_select(0, ids)[..., None]
        return grouped.reshape(ids.shape[0], self.shape[1])

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ Wᵀ``: on ``MatMulNBits`` plus the per-group offsets where it maps, else with the decoded ``W``."""
        if not self._maps(MATMUL_BITS):
            return x @ self.values().T
        product = matmul_nbits(x, self.codes, self.scale.float(), self.shape[1], self.bits, self.accuracy_level)
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
            return self.codes.index_select(0, ids).float()
        if self._maps(GATHER_BITS):
            return self._contrib_rows(ids)
        return self._decode(*(getattr(self, name).index_select(0, ids) for name in ("codes", "scale", "minimum")))


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
        vectors = nn.functional.embedding(indices, self.codebook.float())  # (rows, columns / dim, dim): one Gather
        return vectors.reshape(codes.shape[0], self.shape[1]) * scale.float()

    def values(self) -> torch.Tensor:
        return self._decode(self.codes, getattr(self, "high", None), self.scale)

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.values().T

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        high = self.high.index_select(0, ids) if self.high_bits else None
        return self._decode(self.codes.index_select(0, ids), high, self.scale.index_select(0, ids))


class GraphTernary(nn.Module):
    """A ``TernaryTensor``'s buffers with a traced decode: each byte's five levels from a 243 × 5 table (one
    ``Gather``), the padding sliced off, times the group's level."""

    def __init__(self, stored: TernaryTensor) -> None:
        super().__init__()
        self.shape, self.group_size = stored.shape, stored.group_size
        for name, buffer in stored.named_buffers():
            self.register_buffer(name, buffer)
        self.register_buffer("levels", level_table(torch.float32), persistent=False)

    def _decode(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        rows = codes.shape[0]
        values = nn.functional.embedding(codes.long(), self.levels).reshape(rows, -1)[:, : self.shape[1]]
        grouped = values.reshape(rows, -1, self.group_size) * scale.float()[..., None]
        return grouped.reshape(rows, self.shape[1])

    def values(self) -> torch.Tensor:
        return self._decode(self.codes, self.scale)

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.values().T

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._decode(self.codes.index_select(0, ids), self.scale.index_select(0, ids))


def graph_form(stored: LowBitTensor | CodebookTensor | TernaryTensor) -> GraphLowBit | GraphCodebook | GraphTernary:
    """The graph-decoded form of a stored matrix."""
    if isinstance(stored, TernaryTensor):
        return GraphTernary(stored)
    return GraphCodebook(stored) if isinstance(stored, CodebookTensor) else GraphLowBit(stored)
