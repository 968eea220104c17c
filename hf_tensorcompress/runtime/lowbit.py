"""Low-bit storage of a matrix: integer codes packed into bytes with per-group fp16 scale and minimum.

Ships inside saved checkpoints (imports torch and the layer contract only). Compressed layers keep their factors, cores or rows in a
``LowBitTensor`` so that what sits on disk *and* in memory is the packed form; the float values are rebuilt only for
the rows a forward needs (``rows``) or a chunk at a time (``matmul_t``), never as a whole float copy.

Codes are asymmetric round-to-nearest per group of ``group_size`` consecutive columns of a row:
``x ≈ code · scale + minimum`` with ``code ∈ [0, 2^bits − 1]``. ``bits`` ∈ {2, 3, 4, 8} pack 8 codes into ``bits``
bytes (so int4 is two codes per byte, int2 four); ``bits=16`` keeps plain bfloat16 values (no codes). ``bits=1`` is
a sign per weight (BinaryConnect / XNOR-Net): the levels ``±a`` of a group, ``a = mean|x|`` (the least-squares level
of sign codes; stored as ``minimum = −a``, ``scale = 2a``, so it decodes like every width and rounding ``±a`` gives
``±a`` back), eight codes a byte, first column in the highest bit (Biprop's mask order, one decode for both).
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch
from torch import nn

from .bit_packing import pack_bits, unpack_bits
from .contract import TensorProblem, expect_tensor
from .optional import sibling

#: Bit widths a LowBitTensor stores.
LOWBIT_BITS = (1, 2, 3, 4, 8, 16)

#: Rows decoded per step of a product on the CPU (a chunk stays in cache; the fused kernel is the usual CPU path).
CPU_CHUNK_ROWS = 1024
#: Float bytes decoded per step of a product on a GPU: there each step costs ~15 kernel launches whatever its size,
#: so a chunk is as large as this cap allows (the bf16 table of SmolLM2's 49,152 x 576 embedding in two steps),
#: and the transient stays bounded rather than the whole float table.
ACCELERATOR_CHUNK_BYTES = 32 * 2**20

#: Whether a 16-bit integer's low byte comes first in memory (int4 codes are split through that layout). Read from
#: the interpreter, not from a tensor: this module is first imported while transformers builds a model on the meta
#: device, where a tensor made at import time has no values.
LITTLE_ENDIAN = sys.byteorder == "little"


def check_lowbit(bits: int, group_size: int | None, columns: int) -> int:
    """The group size to use for ``columns`` (``None``: one group per row); a clear error for bad settings."""
    if bits not in LOWBIT_BITS:
        raise ValueError(f"bits={bits!r} is not a stored width; choose one of {list(LOWBIT_BITS)}")
    group = columns if group_size is None else group_size
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or columns % group:
        raise ValueError(
            f"group_size={group_size!r} must be a positive int dividing the {columns} columns (or None for one "
            "group per row)"
        )
    return group


def group_params(tensor: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group ``(scale, minimum)`` (fp16, ``(rows, groups)``) spanning each group's range in ``2^bits − 1``
    steps (1 bit: the levels ``±mean|x|``); rounded to fp16 here so that codes chosen against them decode exactly as
    stored."""
    rows, columns = tensor.shape
    grouped = tensor.detach().float().reshape(rows, columns // group_size, group_size)
    if bits == 1:
        level = grouped.abs().mean(dim=-1).clamp(min=1e-8, max=torch.finfo(torch.float16).max / 2).half()
        level = level.clamp(min=torch.finfo(torch.float16).tiny)
        return level * 2, -level
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    minimum = low.half()
    scale = ((high - minimum.float()) / (2**bits - 1)).clamp(min=1e-8).half().clamp(min=torch.finfo(torch.float16).tiny)
    return scale, minimum


def encode(tensor: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest codes (uint8, unpacked) of ``tensor`` against per-group ``scale`` and ``minimum``."""
    rows, columns = tensor.shape
    group = columns // scale.shape[1]
    grouped = tensor.detach().float().reshape(rows, -1, group)
    codes = torch.round((grouped - minimum.float()[..., None]) / scale.float()[..., None])
    return codes.clamp(0, 2**bits - 1).to(torch.uint8).reshape(rows, columns)


def stored_values(tensor: torch.Tensor, bits: int, group_size: int | None, dtype: torch.dtype) -> torch.Tensor:
    """What ``LowBitTensor.quantize(tensor, bits, group_size).dequantize(dtype)`` returns, bit for bit, without
    packing codes or building a module: quantization-aware training calls this on every factor at every step."""
    rows, columns = tensor.shape
    group = check_lowbit(bits, group_size, columns)
    if bits == 16:
        return tensor.detach().to(torch.bfloat16).to(dtype)
    scale, minimum = group_params(tensor, bits, group)
    values = encode(tensor, scale, minimum, bits).to(dtype).view(rows, columns // group, group)
    return values.mul_(scale.to(dtype)[..., None]).add_(minimum.to(dtype)[..., None]).view(rows, columns)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``(rows, columns)`` codes < 2^bits → ``(rows, ⌈columns/8⌉·bits)`` bytes: 8 codes fill ``bits`` bytes (1 bit:
    the first column in the highest bit)."""
    rows, columns = codes.shape
    padded = torch.nn.functional.pad(codes, (0, (-columns) % 8))
    if bits == 1:
        return pack_bits(padded).reshape(rows, -1)
    padded = padded.to(torch.int64).reshape(rows, -1, 8)
    shifts = torch.arange(8, device=codes.device) * bits
    word = (padded << shifts).sum(dim=-1, keepdim=True)
    byte_shifts = torch.arange(bits, device=codes.device) * 8
    return ((word >> byte_shifts) & 255).to(torch.uint8).reshape(rows, -1)


def unpack(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """Inverse of ``pack``: ``(rows, columns)`` uint8 codes. This runs on every decoding step, so each width takes
    its fastest CPU path: int4 splits through a 16-bit widening, int2 and int3 with scalar shifts on contiguous
    uint8 (far faster than a broadcast shift over wider integers)."""
    rows = packed.shape[0]
    if bits == 8:
        return packed[:, :columns]
    if bits == 1:
        return unpack_bits(packed, packed.numel() * 8).reshape(rows, -1)[:, :columns].to(torch.uint8)
    if bits == 4 and LITTLE_ENDIAN:  # each byte widened to 16 bits, its high code moved to the upper
        wide = packed.to(torch.int16)  # byte: read back as bytes, the two codes are in column order
        return ((wide & 15) | ((wide >> 4) << 8)).view(torch.uint8).reshape(rows, -1)[:, :columns]
    if bits in (2, 4):
        parts = [(packed >> shift) & (2**bits - 1) for shift in range(0, 8, bits)]
    else:  # 3 bits: 8 codes in 3 little-endian bytes, codes 2 and 5 straddle a byte boundary; the three byte
        # planes are made contiguous first (shifts on stride-3 views run at half the speed)
        low, mid, high = packed.reshape(rows, -1, 3).permute(2, 0, 1).contiguous()
        parts = [
            low & 7,
            (low >> 3) & 7,
            (low >> 6) | ((mid & 1) << 2),
            (mid >> 1) & 7,
            (mid >> 4) & 7,
            (mid >> 7) | ((high & 3) << 1),
            (high >> 2) & 7,
            high >> 5,
        ]
    return torch.stack(parts, dim=-1).reshape(rows, -1)[:, :columns]


class StoredMatrix(nn.Module):
    """What every storage format of a ``(rows, columns)`` matrix shares (``LowBitTensor``, ``CodebookTensor``): its
    buffers' dtypes *are* the format, so ``.to(dtype)`` leaves them alone; rows are decoded only on demand, by the
    subclass's ``_decode``, and a product decodes a chunk of rows at a time into one reused buffer."""

    shape: tuple[int, int]
    #: The buffers' dtypes are the format: a checkpoint must hold exactly these (``runtime/checks.py``), where a float
    #: parameter of a layer may be stored in any float dtype the model is loaded in.
    keeps_dtypes = True

    def check_state(self) -> None:
        """Raise ``TensorProblem`` for a buffer that is not what a saved matrix of this format holds (the fused
        kernels read them by their sizes, so a wrong dtype or shape would read past them)."""
        raise NotImplementedError

    def check_width(self, hidden: torch.Tensor) -> None:
        """``hidden``'s last size is the stored columns (a product with another width has no meaning)."""
        if hidden.shape[-1] != self.shape[1]:
            raise ValueError(
                f"matmul_t: the hidden states have {hidden.shape[-1]} columns, but the stored matrix has "
                f"{self.shape[1]}; pass (..., {self.shape[1]}) vectors"
            )

    def _decode(self, rows: slice | torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def _take(buffer: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
        """``rows`` of a buffer: a slice reads a view, an index tensor gathers a copy."""
        return buffer[rows] if isinstance(rows, slice) else buffer.index_select(0, rows)

    def rows(self, ids: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float values of rows ``ids`` (all rows if None); only those rows are decoded."""
        return self._decode(slice(None) if ids is None else ids.reshape(-1).to(self.codes.device), dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole float matrix (for analysis and tests; layers use ``rows`` and ``matmul_t``)."""
        return self.rows(None, dtype)

    def decode_into(self, ids: torch.Tensor, out: torch.Tensor, places: torch.Tensor, in_range: bool = False) -> None:
        """``out[places] = rows(ids)`` in ``out``'s dtype: in C where the checkpoint carries the kernel and it covers
        the layout (one pass over the codes, no float temporaries), else decoded with torch. ``in_range``: the caller
        derived ``ids`` and ``places`` from their bounds (the C code then skips looking at every index)."""
        kernel = sibling("lowbit_kernel")
        if kernel is None or not self._decode_in_kernel(kernel, ids, out, places, in_range):
            out[places] = self._decode(ids.to(self.codes.device), out.dtype)

    def _decode_in_kernel(
        self, kernel, ids: torch.Tensor, out: torch.Tensor, places: torch.Tensor, in_range: bool
    ) -> bool:
        return False

    def kernel_form(self, kernel: ModuleType) -> tuple | None:
        """This matrix as a ``TierForm`` of the kernel's ``decode_tiers`` (None where the kernel does not cover it)."""
        return None

    def chunk_rows(self, hidden: torch.Tensor) -> int:
        """Rows a product decodes per step: ``CPU_CHUNK_ROWS`` on the CPU, as many as ``ACCELERATOR_CHUNK_BYTES``
        of ``hidden``'s dtype hold elsewhere (on a GPU the launches of a step, not its size, cost the time)."""
        if hidden.device.type == "cpu":
            return CPU_CHUNK_ROWS
        return max(1, ACCELERATOR_CHUNK_BYTES // (self.shape[1] * hidden.element_size()))

    def _chunked_matmul_t(self, hidden: torch.Tensor, chunk: int | None) -> torch.Tensor:
        """``hidden @ Wᵀ`` decoding ``chunk`` (default ``chunk_rows``) consecutive rows at a time (views of the stored
        buffers) into one reused buffer: the transient is one chunk, never the whole float table, and a decoding step
        allocates the same few buffers each time (varied sizes would fragment the heap, which keeps tens of MB
        resident)."""
        rows, columns = self.shape
        chunk = chunk or self.chunk_rows(hidden)
        scores = hidden.new_empty(*hidden.shape[:-1], rows)
        weight = hidden.new_empty(min(chunk, rows), columns)
        for start in range(0, rows, chunk):
            block = weight[: min(chunk, rows - start)]
            self._decode(slice(start, start + chunk), hidden.dtype, out=block)
            scores[..., start : start + len(block)] = hidden @ block.T
        return scores

    @torch.no_grad()
    def copy_(self, other: StoredMatrix) -> StoredMatrix:
        """Take ``other``'s buffers (stored alike), in place: the buffers keep their identity."""
        for name, buffer in self.named_buffers():
            buffer.copy_(other.get_buffer(name))
        return self

    def _apply(self, fn, recurse: bool = True) -> StoredMatrix:
        """``.to(device)`` moves the buffers (``to_empty`` allocates them, from the meta device); ``.to(dtype)`` /
        ``.half()`` (e.g. the model's dtype at load time) leave them alone."""
        device = fn(torch.empty(0, device=self.codes.device)).device
        for name, buffer in self._buffers.items():  # a meta buffer has no values to move: ``to_empty`` makes it anew
            self._buffers[name] = fn(buffer).to(buffer.dtype) if buffer.is_meta else buffer.to(device)
        return self

    def storage_bits(self) -> int:
        """Bits held on disk and in memory: every buffer."""
        return sum(buffer.numel() * buffer.element_size() * 8 for buffer in self.buffers())


class LowBitTensor(StoredMatrix):
    """A ``(rows, columns)`` matrix stored as packed codes + fp16 scales/minima (buffers of their final shapes, so
    ``LowBitTensor(shape, bits, group_size)`` followed by ``load_state_dict`` restores a saved one)."""

    def __init__(self, shape: tuple[int, int] | list[int], bits: int, group_size: int | None = None) -> None:
        super().__init__()
        rows, columns = (int(size) for size in shape)
        self.shape = (rows, columns)
        self.bits = bits
        self.group_size = check_lowbit(bits, group_size, columns)
        if bits == 16:
            self.register_buffer("codes", torch.zeros(rows, columns, dtype=torch.bfloat16))
            return
        self.register_buffer("codes", torch.zeros(rows, -(-columns // 8) * bits, dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(rows, columns // self.group_size, dtype=torch.float16))
        self.register_buffer("minimum", torch.zeros(rows, columns // self.group_size, dtype=torch.float16))

    @classmethod
    def quantize(cls, tensor: torch.Tensor, bits: int, group_size: int | None = None) -> LowBitTensor:
        """Round-to-nearest storage of the 2-D ``tensor``."""
        if tensor.dim() != 2:
            raise ValueError(f"LowBitTensor stores matrices; got shape {tuple(tensor.shape)} (reshape to 2-D first)")
        stored = cls(tensor.shape, bits, group_size).to(tensor.device)
        if bits == 16:
            stored.codes.copy_(tensor.detach())
            return stored
        scale, minimum = group_params(tensor, bits, stored.group_size)
        return stored.set_codes(encode(tensor, scale, minimum, bits), scale, minimum)

    @torch.no_grad()
    def set_codes(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> LowBitTensor:
        """Store codes chosen elsewhere (e.g. by output-aware rounding) with their group parameters."""
        self.codes.copy_(pack(codes, self.bits))
        self.scale.copy_(scale)
        self.minimum.copy_(minimum)
        return self

    def spec(self) -> dict:
        return {"shape": list(self.shape), "bits": self.bits, "group_size": self.group_size}

    @classmethod
    def from_spec(cls, spec: dict) -> LowBitTensor:
        return cls(spec["shape"], spec["bits"], spec["group_size"])

    def check_state(self) -> None:
        rows, columns = self.shape
        if self.bits == 16:
            expect_tensor(self.codes, "codes", torch.bfloat16, (rows, columns))
            return
        groups = (rows, columns // self.group_size)
        expect_tensor(self.codes, "codes", torch.uint8, (rows, -(-columns // 8) * self.bits))
        expect_tensor(self.scale, "scale", torch.float16, groups)
        expect_tensor(self.minimum, "minimum", torch.float16, groups)
        if self.codes.is_meta or not rows:
            return
        if columns % 8 and unpack(self.codes[:, -self.bits :], self.bits, 8)[:, columns % 8 :].any():
            raise TensorProblem("codes", f"holds codes past the {columns} columns, in the padding that is always 0")
        if (self.scale <= 0).any():
            raise TensorProblem("scale", "holds a value <= 0, where every group's scale is positive")

    def _with_buffers(self, rows: int, buffers: dict[str, torch.Tensor]) -> LowBitTensor:
        """A ``LowBitTensor`` stored like this one with ``rows`` rows held by ``buffers`` (no copy, no encoding)."""
        made = LowBitTensor((0, self.shape[1]), self.bits, self.group_size)
        made.shape = (rows, self.shape[1])
        made._buffers.update(buffers)
        return made

    def select(self, ids: torch.Tensor) -> LowBitTensor:
        """Rows ``ids`` (in that order) as a new ``LowBitTensor``; exact, since every row is stored on its own."""
        ids = ids.reshape(-1).to(self.codes.device)
        return self._with_buffers(
            len(ids), {name: buffer.index_select(0, ids) for name, buffer in self.named_buffers()}
        )

    def cat(self, other: LowBitTensor) -> LowBitTensor:
        """This tensor's rows followed by ``other``'s (stored alike: same width, columns and group size)."""
        if (other.bits, other.shape[1], other.group_size) != (self.bits, self.shape[1], self.group_size):
            raise ValueError(f"cannot append rows stored as {other.extra_repr()} to {self.extra_repr()}")
        joined = {
            name: torch.cat([buffer, other.get_buffer(name).to(buffer.device)]) for name, buffer in self.named_buffers()
        }
        return self._with_buffers(self.shape[0] + other.shape[0], joined)

    @torch.no_grad()
    def set_rows(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Re-encode rows ``ids`` to ``values`` (round-to-nearest), in place."""
        fresh = LowBitTensor.quantize(values.detach().to(self.codes.device), self.bits, self.group_size)
        ids = ids.reshape(-1).to(self.codes.device)
        for name, buffer in self.named_buffers():
            buffer[ids] = fresh.get_buffer(name)

    def _decode(self, rows: slice | torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float values of ``rows``: a slice reads views of the buffers, an index tensor gathers copies. ``out``
        (``(len(rows), columns)``) receives them in place, so a caller decoding chunk after chunk reuses one buffer."""
        codes = self._take(self.codes, rows)
        values = codes if self.bits == 16 else unpack(codes, self.bits, self.shape[1])
        out = values.to(dtype) if out is None else out.copy_(values)
        if self.bits != 16:
            grouped = out.view(len(codes), -1, self.group_size)
            scale, minimum = (
                self._take(self.scale, rows).to(dtype)[..., None],
                self._take(self.minimum, rows).to(dtype)[..., None],
            )
            grouped.mul_(scale).add_(minimum)  # in place (4x faster here than an addcmul writing into its input)
        return out

    def kernel_form(self, kernel: ModuleType) -> tuple | None:
        """This matrix as a ``TierForm`` of the kernel's ``decode_tiers`` (None where the kernel does not cover it)."""
        if self.bits == 16:
            return None
        return kernel.lowbit_form(self.codes, self.scale, self.minimum, self.bits, self.group_size, self.shape[1])

    def _decode_in_kernel(
        self, kernel, ids: torch.Tensor, out: torch.Tensor, places: torch.Tensor, in_range: bool
    ) -> bool:
        if self.bits == 16:
            return False
        return kernel.decode_lowbit_rows(
            self.codes, self.scale, self.minimum, self.bits, self.group_size, self.shape[1], ids, out, places, in_range
        )

    def matmul_t(self, hidden: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """``hidden @ Wᵀ`` (``(..., columns) → (..., rows)``). A few hidden vectors (a decoding step) go through the
        fused CPU kernel (``lowbit_kernel``, where the checkpoint carries it), which multiplies the codes without
        writing floats anywhere; otherwise ``chunk`` rows (default ``chunk_rows``) at a time are decoded and
        multiplied."""
        self.check_width(hidden)
        kernel = sibling("lowbit_kernel")
        if self.bits != 16 and kernel is not None:
            fused = kernel.fused_matmul_t(
                self.codes, self.scale, self.minimum, self.bits, self.group_size, hidden, columns=self.shape[1]
            )
            if fused is not None:
                return fused
        return self._chunked_matmul_t(hidden, chunk)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, bits={self.bits}, group_size={self.group_size}"
