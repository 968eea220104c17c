"""Fused CPU kernels for ``LowBitTensor.matmul_t`` and ``CodebookTensor.matmul_t`` at small batch (a decoding step).

Ships inside saved checkpoints (torch and the standard library only). At batch 1 the tied output head of a low-bit
embedding must read every code of the table each step; unpacking the codes into a float chunk and calling a GEMM
(the torch path) costs three times the dense fp32 product, because every elementwise pass over the codes is a trip
through memory. This kernel reads each group of eight codes from its ``bits`` bytes once, spreads them into eight
lanes with one AVX2 variable shift, and multiplies them into the hidden state while they sit in registers, so the
head reads 4–8× fewer bytes than the fp32 table and does no extra pass. Codebook rows take a lookup table
instead (``fused_codebook_matmul_t``), or, for five or more hidden vectors, a C decode of each chunk of rows for a
GEMM. Rows are decoded in C too where a product with many hidden states or a lookup needs them as floats
(``decode_lowbit_rows``, ``decode_codebook_rows``; ``decode_tiers`` for a tiered embedding, every tier in one call).

None of the maintained libraries does this for these layouts: torch's ``_weight_int4pack_mm_for_cpu`` is int4 only
(and slower than the fp32 product on AVX2 machines), torchao and bitsandbytes have no 3-bit CPU path. The kernel is
hand-written C (``lowbit_kernel_source.py``), compiled once per machine with the system C compiler into a cache that
maps only files this user's build wrote (``lowbit_kernel_cache.py``) and called through ``ctypes``. Where it cannot
run (no compiler, no AVX2, an untrusted cache, a GPU tensor, layouts it does not cover, or
``HF_TENSORCOMPRESS_KERNELS=0``) ``fused_matmul_t`` returns None and the caller takes the torch path, which gives
the same values up to float summation order.

This file holds the Python entry points: the checks of every buffer the C code reads, and the calls.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

from .lowbit_kernel_cache import build_or_load

#: Largest number of hidden vectors the kernel multiplies in one pass (a decoding step at batch ≤ 8); more go
#: through the chunked GEMM, which decodes each chunk once for all of them.
MAX_VECTORS = 8

#: Rows below which splitting the work over threads costs more than it saves.
MIN_ROWS_PER_THREAD = 4096

#: Hidden vectors from which a codebook product decodes its rows for a GEMM instead of summing lookup-table entries
#: (the table's gathers grow with every hidden vector; a decoded chunk serves all of them), and the rows it decodes
#: at a time (an fp32 buffer that stays in the cache).
DECODE_FROM_VECTORS = 5
DECODE_CHUNK_ROWS = 1024

#: Rows per thread of a decode of scattered rows into a buffer (a lookup, a block of the head's GEMM): a row is
#: hundreds of values, so a few dozen of them outweigh handing a part to one of torch's waiting threads.
DECODE_ROWS_PER_THREAD = 64


@functools.cache
def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (with one warning saying why) where it cannot run here."""
    if platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in (
        "AVX2",
        "AVX512",
    ):
        return None  # the torch path serves other CPUs; nothing to warn about
    try:
        library, _ = build_or_load()
    except (OSError, RuntimeError, ValueError) as error:  # ValueError: a bad timeout setting
        warnings.warn(
            f"low-bit products take the slower torch path: the CPU kernel is unavailable ({error})", stacklevel=3
        )
        return None
    library.lowbit_matmul_t.restype = library.codebook_matmul_t.restype = library.codebook_table.restype = None
    library.lowbit_matmul_t.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.codebook_matmul_t.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.codebook_table.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    library.codebook_decode.restype = library.lowbit_decode.restype = None
    library.codebook_decode.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [ctypes.c_int,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.lowbit_decode.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.tiered_decode.restype = ctypes.c_int64
    library.tiered_decode.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 2 + [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    library.built_with_openmp.restype = ctypes.c_int
    return library


def _enabled(stored: torch.Tensor, vectors: int, most: int | None = MAX_VECTORS) -> bool:
    """What the kernels need: not switched off, a CPU tensor with rows, and vectors to multiply (a decoding step's
    few, ``most``, for the products that read the codes once per vector)."""
    return (
        os.environ.get("HF_TENSORCOMPRESS_KERNELS", "1") != "0"
        and stored.is_cpu
        and stored.shape[0] > 0
        and vectors > 0
        and (most is None or vectors <= most)
    )


def covered(codes: torch.Tensor, bits: int, columns: int, group: int, vectors: int) -> bool:
    """Whether the kernel handles this product (else the torch path does)."""
    return _enabled(codes, vectors) and bits in (2, 3, 4, 8) and columns % 8 == 0 and group % 8 == 0


def _carries_gradient(hidden: torch.Tensor) -> bool:
    """Whether the product must pass a gradient back to ``hidden`` (training through the head): the C code is not
    differentiable, so the torch path serves it."""
    return torch.is_grad_enabled() and hidden.requires_grad


def _expect(tensor: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """A buffer the C code reads by the sizes it is given: anything else would be read past its end."""
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"fused kernel: {name} is {tensor.dtype} of shape {list(tensor.shape)}, expected {dtype} of shape "
            f"{list(shape)}"
        )


def _expect_width(hidden: torch.Tensor, columns: int) -> None:
    if hidden.shape[-1] != columns:
        raise ValueError(
            f"fused kernel: the hidden states have {hidden.shape[-1]} columns, but the stored matrix has {columns}"
        )


def _lowbit_buffers(
    codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int, group: int, columns: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A packed matrix's buffers, checked against the sizes its ``bits``, ``group`` and ``columns`` give them (the C
    code reads them by those sizes) and made contiguous."""
    rows = codes.shape[0]
    _expect(codes, "codes", torch.uint8, (rows, -(-columns // 8) * bits))
    _expect(scale, "scale", torch.float16, (rows, columns // group))
    _expect(minimum, "minimum", torch.float16, (rows, columns // group))
    return codes.contiguous(), scale.contiguous(), minimum.contiguous()


def _codebook_buffers(
    low: torch.Tensor, high: torch.Tensor | None, high_bits: int, scale: torch.Tensor, codebook: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``CodebookTensor``'s buffers, checked against the sizes ``low`` and ``codebook`` give them (an index is a
    byte plus ``high_bits`` bits, so the codebook must hold ``256 · 2^high_bits`` entries) and made contiguous;
    ``high`` is ``low`` where there are no high bits (the C code does not read it then)."""
    rows, vectors = low.shape[0], low.shape[-1]
    _expect(low, "low", torch.uint8, (rows, vectors))
    _expect(scale, "scale", torch.float16, (rows, 1))
    _expect(codebook, "codebook", torch.float16, (256 << high_bits, codebook.shape[-1]))
    if high_bits:
        _expect(high, "high", torch.uint8, (rows, -(-vectors // 8) * high_bits))
    low = low.contiguous()
    return low, low if high is None else high.contiguous(), scale.contiguous(), codebook.contiguous()


def fused_matmul_t(
    codes: torch.Tensor,
    scale: torch.Tensor,
    minimum: torch.Tensor,
    bits: int,
    group: int,
    hidden: torch.Tensor,
    columns: int | None = None,
) -> torch.Tensor | None:
    """``hidden @ Wᵀ`` for the packed ``W`` (``(..., columns) → (..., rows)`` in ``hidden``'s dtype), or None where
    the kernel does not cover it. The sizes come from the stored tensors (``columns``: the matrix's width, by default
    what the codes hold) and are checked before the C code runs: a ``hidden`` of another width, or buffers of
    another dtype or shape, raise ValueError."""
    if bits not in (2, 3, 4, 8):
        return None
    rows = codes.shape[0]
    columns = codes.shape[1] // bits * 8 if columns is None else columns
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or columns % group:
        raise ValueError(f"fused kernel: group={group!r} must be a positive int dividing the {columns} columns")
    codes, scale, minimum = _lowbit_buffers(codes, scale, minimum, bits, group, columns)
    _expect_width(hidden, columns)
    flat = hidden.reshape(-1, columns)
    if not covered(codes, bits, columns, group, len(flat)) or _carries_gradient(hidden):
        return None
    library = load_kernel()
    if library is None:
        return None
    flat = flat.float().contiguous()
    group_sums = flat.view(len(flat), -1, group).sum(-1).contiguous()
    out = torch.empty(len(flat), rows)

    library.lowbit_matmul_t(codes.data_ptr(), scale.data_ptr(), minimum.data_ptr(), rows, codes.shape[1], bits,
        columns, group, flat.data_ptr(), group_sums.data_ptr(), len(flat), out.data_ptr(), _workers(rows))  # fmt: skip
    return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)


def fused_codebook_matmul_t(
    low: torch.Tensor,
    high: torch.Tensor | None,
    high_bits: int,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    hidden: torch.Tensor,
) -> torch.Tensor | None:
    """``hidden @ Wᵀ`` for a ``CodebookTensor``'s ``W`` (index low bytes ``low``, packed ``high`` bits, per-row fp16
    ``scale``, fp16 ``codebook``), or None where the kernel does not cover it. Each hidden vector's dot products with
    every codebook entry, slice by slice, form a table (a few hundred KB); each logit is then a sum of table entries
    picked by the row's indices, so the rows are never decoded. From ``DECODE_FROM_VECTORS`` hidden vectors on (any
    number of them), the rows are decoded in C a chunk at a time for a GEMM instead. The sizes come from the stored
    tensors and are checked before the C code runs (an index is a byte plus ``high_bits`` bits, so the codebook must
    hold ``256 · 2^high_bits`` entries): a ``hidden`` of another width, or buffers of another dtype or shape, raise
    ValueError."""
    if high_bits not in (0, 2, 3, 4):
        return None
    rows, vectors = low.shape[0], low.shape[-1]
    dim = codebook.shape[-1]
    low, high, scale, codebook = _codebook_buffers(low, high, high_bits, scale, codebook)
    entries = codebook.shape[0]
    _expect_width(hidden, vectors * dim)
    flat = hidden.reshape(-1, vectors * dim)
    decode = len(flat) >= DECODE_FROM_VECTORS
    if not _enabled(low, len(flat), None if decode else MAX_VECTORS) or _carries_gradient(hidden):
        return None
    library = load_kernel()
    if library is None:
        return None
    flat = flat.float().contiguous()
    if decode:
        out = _decoded_codebook_product(library, low, high, high_bits, scale, codebook, flat)
        return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)
    table, scratch = torch.empty(len(flat), vectors, entries), torch.empty(dim, entries)
    library.codebook_table(flat.data_ptr(), codebook.data_ptr(), vectors, dim, entries, len(flat),
        scratch.data_ptr(), table.data_ptr())  # fmt: skip
    out = torch.empty(len(flat), rows)

    library.codebook_matmul_t(low.data_ptr(), high.data_ptr(), scale.data_ptr(), rows, vectors, high.shape[1],
        high_bits, table.data_ptr(), entries, len(flat), out.data_ptr(), _workers(rows))  # fmt: skip
    return out.to(hidden.dtype).reshape(*hidden.shape[:-1], rows)


def _decoded_codebook_product(
    library: ctypes.CDLL,
    low: torch.Tensor,
    high: torch.Tensor,
    high_bits: int,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    flat: torch.Tensor,
) -> torch.Tensor:
    """``flat @ Wᵀ`` (``(n, rows)``) decoding ``DECODE_CHUNK_ROWS`` rows at a time into one fp32 buffer (C) and
    multiplying each chunk with every hidden vector in one GEMM: a codebook row costs one copy of its entries
    here, where the lookup table costs one gather per entry and hidden vector."""
    rows, vectors = low.shape
    dim = codebook.shape[1]
    chunk = min(rows, DECODE_CHUNK_ROWS)
    decoded, out = torch.empty(chunk, vectors * dim), torch.empty(rows, len(flat))
    for first in range(0, rows, chunk):
        count = min(chunk, rows - first)
        threads = _workers(count, per_thread=DECODE_CHUNK_ROWS // 2)
        library.codebook_decode(low.data_ptr(), high.data_ptr(), scale.data_ptr(), None, None, first, count, vectors,
            high.shape[1], high_bits, codebook.data_ptr(), dim, decoded.data_ptr(), threads)  # fmt: skip
        torch.mm(decoded[:count], flat.T, out=out[first : first + count])
    return out.T


def _rows_and_places(
    index: torch.Tensor, dest: torch.Tensor, rows: int, out: torch.Tensor, width: int, in_range: bool
) -> bool:
    """Whether a decode of rows ``index`` into rows ``dest`` of ``out`` can run in C: fp32 ``out`` of ``width``
    columns, contiguous, on the CPU; indices in range (the C code reads and writes where they point), looked at here
    unless the caller vouches for them (``in_range``: indices it derived from their bounds)."""
    if out.dtype != torch.float32 or out.dim() != 2 or out.shape[1] != width or not out.is_contiguous():
        return False
    if index.shape != dest.shape or index.dim() != 1 or not len(index):
        return False
    if in_range:
        return True
    return 0 <= int(index.min()) and int(index.max()) < rows and 0 <= int(dest.min()) and int(dest.max()) < len(out)


def decode_lowbit_rows(
    codes: torch.Tensor,
    scale: torch.Tensor,
    minimum: torch.Tensor,
    bits: int,
    group: int,
    columns: int,
    index: torch.Tensor,
    out: torch.Tensor,
    dest: torch.Tensor,
    in_range: bool = False,
) -> bool:
    """``out[dest] = rows index`` of the packed matrix, decoded in C; False (nothing written) where the kernel does
    not cover it, and the caller decodes with torch. ``in_range``: the caller has bounded ``index`` and ``dest``."""
    rows = codes.shape[0]
    if not covered(codes, bits, columns, group, 1) or not _rows_and_places(index, dest, rows, out, columns, in_range):
        return False
    codes, scale, minimum = _lowbit_buffers(codes, scale, minimum, bits, group, columns)
    library = load_kernel()
    if library is None:
        return False
    index, dest = index.long().contiguous(), dest.long().contiguous()
    library.lowbit_decode(codes.data_ptr(), scale.data_ptr(), minimum.data_ptr(), index.data_ptr(), dest.data_ptr(),
        len(index), rows, codes.shape[1], bits, columns, group, out.data_ptr(),
        _workers(len(index), per_thread=DECODE_ROWS_PER_THREAD))  # fmt: skip
    return True


def decode_codebook_rows(
    low: torch.Tensor,
    high: torch.Tensor | None,
    high_bits: int,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    index: torch.Tensor,
    out: torch.Tensor,
    dest: torch.Tensor,
    in_range: bool = False,
) -> bool:
    """``out[dest] = rows index`` of a ``CodebookTensor``'s matrix, decoded in C; False (nothing written) where the
    kernel does not cover it, and the caller decodes with torch. ``in_range``: the caller has bounded ``index`` and
    ``dest``."""
    rows, vectors = low.shape[0], low.shape[-1]
    dim = codebook.shape[-1]
    if high_bits not in (0, 2, 3, 4) or not _enabled(low, 1, None):
        return False
    if not _rows_and_places(index, dest, rows, out, vectors * dim, in_range):
        return False
    low, high, scale, codebook = _codebook_buffers(low, high, high_bits, scale, codebook)
    library = load_kernel()
    if library is None:
        return False
    index, dest = index.long().contiguous(), dest.long().contiguous()
    library.codebook_decode(low.data_ptr(), high.data_ptr(), scale.data_ptr(), index.data_ptr(), dest.data_ptr(), 0,
        len(index), vectors, high.shape[1], high_bits, codebook.data_ptr(), dim, out.data_ptr(),
        _workers(len(index), per_thread=DECODE_ROWS_PER_THREAD))  # fmt: skip
    return True


class TierForm(NamedTuple):
    """One tier of a ``decode_tiers`` call: its kind, rows and width, four buffer addresses and four sizes (the
    layout ``tiered_decode`` reads), and the tensors behind the addresses, kept alive until the call returns."""

    kind: int
    rows: int
    width: int
    addresses: tuple[int, int, int, int]
    sizes: tuple[int, int, int, int]
    tensors: tuple[torch.Tensor, ...]


#: int64 fields per tier that ``tiered_decode`` reads (``FORM_FIELDS`` in the C source).
FORM_FIELDS = 11

#: ``TierForm.kind``: a tier that stores nothing (zero rows, the caller adds its low-rank part), packed low-bit codes,
#: codebook rows.
ZERO_FORM, LOWBIT_FORM, CODEBOOK_FORM = 0, 1, 2


def zero_form(rows: int, width: int) -> TierForm:
    """A tier that stores no rows of its own."""
    return TierForm(ZERO_FORM, rows, width, (0, 0, 0, 0), (0, 0, 0, 0), ())


def lowbit_form(
    codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int, group: int, columns: int
) -> TierForm | None:
    """A packed low-bit tier as ``decode_tiers`` reads it, or None where the kernel does not cover its layout."""
    rows = codes.shape[0]
    if not covered(codes, bits, columns, group, 1):
        return None
    codes, scale, minimum = _lowbit_buffers(codes, scale, minimum, bits, group, columns)
    addresses = (codes.data_ptr(), scale.data_ptr(), minimum.data_ptr(), 0)
    return TierForm(LOWBIT_FORM, rows, columns, addresses, (codes.shape[1], bits, group, 0), (codes, scale, minimum))


def codebook_form(
    low: torch.Tensor, high: torch.Tensor | None, high_bits: int, scale: torch.Tensor, codebook: torch.Tensor
) -> TierForm | None:
    """A codebook tier as ``decode_tiers`` reads it, or None where the kernel does not cover its layout."""
    rows, vectors = low.shape[0], low.shape[-1]
    dim = codebook.shape[-1]
    if high_bits not in (0, 2, 3, 4) or not _enabled(low, 1, None):
        return None
    low, high, scale, codebook = _codebook_buffers(low, high, high_bits, scale, codebook)
    addresses = (low.data_ptr(), high.data_ptr(), scale.data_ptr(), codebook.data_ptr())
    sizes = (vectors, high.shape[1], high_bits, dim)
    return TierForm(CODEBOOK_FORM, rows, vectors * dim, addresses, sizes, (low, high, scale, codebook))


class TierTable(NamedTuple):
    """What ``tiered_decode`` reads about the tiers: ``fields``, ``(tiers, FORM_FIELDS)`` int64 (each tier's kind,
    first stored row, rows, addresses and sizes, in stored order), for rows ``width`` wide and ``rows`` stored rows
    in all."""

    fields: torch.Tensor
    width: int
    rows: int


def tier_table(forms: list[TierForm | None], width: int) -> TierTable | None:
    """The tiers ``forms`` laid one after another, or None where a tier is not covered or not ``width`` wide. The
    addresses are those of the forms' tensors: the caller keeps them alive while it uses the table."""
    if not forms or any(form is None or form.width != width for form in forms):
        return None
    fields, start = [], 0
    for form in forms:
        fields.append([form.kind, start, form.rows, *form.addresses, *form.sizes])
        start += form.rows
    return TierTable(torch.tensor(fields, dtype=torch.int64), width, start)


def decode_tiers(
    slot: torch.Tensor, table: TierTable, tokens: torch.Tensor | range, out: torch.Tensor, factor: float = 1.0
) -> bool:
    """``out[i]`` = the row of token ``tokens[i]`` of a tiered embedding, stored at row ``slot[token]`` of the tiers
    ``table`` describes, times ``factor`` (fp32, as multiplying ``out`` afterwards would), in one C call for every
    tier; False (nothing written) where the kernel does not cover it (an ``out`` that is not fp32, or not as wide as
    the table's rows). The C code looks up each token and its slot within their bounds: a token outside the
    vocabulary, or a slot outside the tiers, raises IndexError."""
    decode = tier_decoder(slot, table)
    return decode is not None and decode(tokens, out, factor)


def tier_decoder(slot: torch.Tensor, table: TierTable, keep: object = None) -> Callable[..., bool] | None:
    """``decode_tiers`` for this ``slot`` and ``table``, with what a lookup does not change checked once: called with
    ``(tokens, out, factor=1.0)`` it checks only those. A layer keeps it for its stored tensors' addresses, so that a
    lookup of a few tokens costs a few microseconds more than dense. None where the kernel cannot serve ``slot``.
    It holds ``slot``, ``table`` and ``keep`` (what the table's addresses point at) while it lives."""
    if not _enabled(slot, 1, None) or slot.dtype != torch.int32 or slot.dim() != 1 or not slot.is_contiguous():
        return None
    library = load_kernel()
    if library is None or table.rows != slot.shape[0]:
        return None
    call, width, rows, tiers = library.tiered_decode, table.width, table.rows, table.fields.shape[0]
    addresses = (slot.data_ptr(), table.fields.data_ptr())
    held = (slot, table, keep)

    def decode(tokens: torch.Tensor | range, out: torch.Tensor, factor: float = 1.0, _held: tuple = held) -> bool:
        if os.environ.get("HF_TENSORCOMPRESS_KERNELS", "1") == "0":
            return False
        if out.dtype != torch.float32 or out.dim() != 2 or out.shape[1] != width or not out.is_contiguous():
            return False
        first, ids = 0, tokens
        if isinstance(tokens, range):
            if tokens.step != 1:
                return False
            first, ids, count = tokens.start, None, len(tokens)
        elif not tokens.is_cpu:
            return False
        else:
            # sizes from shape and numel(), not len(): a tensor's __len__ runs in Python
            count = tokens.numel()
            if tokens.dtype != torch.int64 or tokens.dim() != 1 or not tokens.is_contiguous():
                ids = tokens.reshape(-1).long().contiguous()
        if count == 0 or out.shape[0] < count:
            return False
        bad = call(addresses[0], rows, None if ids is None else ids.data_ptr(), first, count, addresses[1], tiers,
            width, factor, out.data_ptr(), _workers(count, per_thread=DECODE_ROWS_PER_THREAD))  # fmt: skip
        if bad:
            raise IndexError(
                f"{bad} of {count} tokens are outside the vocabulary of {rows} or stored outside its tiers "
                "(token ids are 0 .. vocabulary size - 1; slot must be a permutation of them)"
            )
        return True

    return decode


def _workers(rows: int, per_thread: int = MIN_ROWS_PER_THREAD) -> int:
    """Threads the C code splits ``rows`` over: ``torch.get_num_threads()``, fewer for small products."""
    return max(1, min(torch.get_num_threads(), rows // per_thread))
