"""Ternary storage of a matrix: BitNet b1.58's three levels per group, five to a byte (1.6 bits a weight).

Each group of ``group_size`` consecutive columns of a row takes BitNet b1.58's codes ``clamp(round(x / m), -1, 1)``
against its absmean ``m = mean|x|``; its level ``s`` is then the mean ``|x|`` of the entries with a non-zero code
(rounded to fp16), the least-squares level for those codes. That level also makes the rounding idempotent: rounding
values that are already ``{-s, 0, +s}`` gives them back, so a kept best checkpoint or a resumed run (which reload the
decoded values as fp32 factors) computes exactly what was validated, where absmean levels would shrink every time.

Stored as ``TernaryTensor``: the codes ``t ∈ {0, 1, 2}`` (value ``(t − 1) · s``) of five consecutive columns are one
base-3 number ``t₀ + 3 t₁ + 9 t₂ + 27 t₃ + 81 t₄ < 243`` in one byte, plus one fp16 ``s`` per group: 1.6 bits a
weight where 2-bit codes would take 2 (3⁵ = 243 fits a byte, 3⁶ does not). A row's last byte pads with code 0. A
decode looks each byte up in a 243 × 5 table of levels (one gather, no integer division), in torch and in ONNX alike.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from .contract import TensorProblem, expect_tensor
from .lowbit import StoredMatrix, check_lowbit

#: Codes a byte holds: 3^5 = 243 values fit in 256.
TRITS_PER_BYTE = 5
#: The place value of each of a byte's five codes, first column first.
TRIT_PLACES = (1, 3, 9, 27, 81)
#: Distinct bytes a packing writes (0 … 242); a larger byte is not a ternary code.
PACKED_VALUES = 3**TRITS_PER_BYTE
#: ``check_lowbit`` validates groups for a packed width; ternary groups obey the same rule as 2-bit codes.
GROUP_CHECK_BITS = 2


def ternary_params(tensor: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scale)``: codes ``{0, 1, 2}`` (uint8, unpacked, ``tensor``'s shape; value ``(code − 1) · s``) and
    per-group ``s`` (fp16, ``(rows, groups)``), the mean ``|x|`` of the group's non-zero codes."""
    rows, columns = tensor.shape
    grouped = tensor.detach().float().reshape(rows, columns // group_size, group_size)
    magnitude = grouped.abs()
    absmean = magnitude.mean(dim=-1, keepdim=True).clamp(min=1e-8)
    levels = torch.round(grouped / absmean).clamp(-1, 1)
    nonzero = levels != 0
    level = (magnitude * nonzero).sum(-1) / nonzero.sum(-1).clamp(min=1)
    high = torch.finfo(torch.float16).max
    scale = level.clamp(1e-8, high).half().clamp(min=torch.finfo(torch.float16).tiny)
    return (levels + 1).to(torch.uint8).reshape(rows, columns), scale


def ternary_values(tensor: torch.Tensor, group_size: int | None, dtype: torch.dtype) -> torch.Tensor:
    """What ``ternary_stored(tensor, group_size).dequantize(dtype)`` returns, bit for bit, without packing codes:
    quantization-aware training calls this on every ternary factor at every step."""
    rows, columns = tensor.shape
    group = check_lowbit(GROUP_CHECK_BITS, group_size, columns)
    codes, scale = ternary_params(tensor, group)
    values = codes.to(dtype).sub_(1).view(rows, columns // group, group)
    return values.mul_(scale.to(dtype)[..., None]).view(rows, columns)


def pack_trits(codes: torch.Tensor) -> torch.Tensor:
    """``(rows, columns)`` codes in {0, 1, 2} → ``(rows, ⌈columns / 5⌉)`` bytes, five codes a byte in base 3."""
    rows, columns = codes.shape
    padded = functional.pad(codes, (0, (-columns) % TRITS_PER_BYTE)).reshape(rows, -1, TRITS_PER_BYTE)
    places = torch.tensor(TRIT_PLACES, dtype=torch.int16, device=codes.device)
    return (padded.to(torch.int16) * places).sum(dim=-1).to(torch.uint8)


def level_table(dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(243, 5)``: the levels ``{-1, 0, +1}`` of the five codes of each byte value, first column first."""
    values = torch.arange(PACKED_VALUES, device=device)[:, None]
    places = torch.tensor(TRIT_PLACES, device=device)
    return (torch.div(values, places, rounding_mode="floor") % 3 - 1).to(dtype)


def ternary_stored(tensor: torch.Tensor, group_size: int | None) -> TernaryTensor:
    """``tensor`` rounded to three levels per group, packed five codes a byte."""
    if tensor.dim() != 2:
        raise ValueError(f"ternary storage takes matrices; got shape {tuple(tensor.shape)}")
    stored = TernaryTensor(tensor.shape, group_size).to(tensor.device)
    return stored.set_codes(*ternary_params(tensor, stored.group_size))


class TernaryTensor(StoredMatrix):
    """A ``(rows, columns)`` matrix of levels ``{-s, 0, +s}`` per group: ``codes`` (uint8, ``(rows, ⌈columns /
    5⌉)``, five base-3 codes a byte) and ``scale`` (fp16 ``s``, ``(rows, groups)``); buffers of their final shapes,
    so ``TernaryTensor(shape, group_size)`` followed by ``load_state_dict`` restores a saved one."""

    def __init__(self, shape: tuple[int, int] | list[int], group_size: int | None = None) -> None:
        super().__init__()
        rows, columns = (int(size) for size in shape)
        self.shape = (rows, columns)
        self.group_size = check_lowbit(GROUP_CHECK_BITS, group_size, columns)
        self.register_buffer("codes", torch.zeros(rows, -(-columns // TRITS_PER_BYTE), dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(rows, columns // self.group_size, dtype=torch.float16))

    @torch.no_grad()
    def set_codes(self, codes: torch.Tensor, scale: torch.Tensor) -> TernaryTensor:
        """Store codes ``{0, 1, 2}`` (unpacked, the matrix's shape) chosen elsewhere, with their per-group levels."""
        self.codes.copy_(pack_trits(codes))
        self.scale.copy_(scale)
        return self

    def spec(self) -> dict:
        return {"shape": list(self.shape), "group_size": self.group_size}

    def check_state(self) -> None:
        rows, columns = self.shape
        expect_tensor(self.codes, "codes", torch.uint8, (rows, -(-columns // TRITS_PER_BYTE)))
        expect_tensor(self.scale, "scale", torch.float16, (rows, columns // self.group_size))
        if self.codes.is_meta or not rows:
            return
        if (self.codes >= PACKED_VALUES).any():
            raise TensorProblem("codes", f"holds a byte above {PACKED_VALUES - 1}, which no five ternary codes pack to")
        tail = columns % TRITS_PER_BYTE
        if tail and (self.codes[:, -1] >= 3**tail).any():
            raise TensorProblem("codes", f"holds codes past the {columns} columns, in the padding that is always 0")
        if (self.scale <= 0).any():
            raise TensorProblem("scale", "holds a value <= 0, where every group's level is positive")

    def _decode(self, rows: slice | torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float values of ``rows`` (a slice reads views, an index tensor gathers copies), written into ``out``
        (``(len(rows), columns)``) when given: each byte's five levels from the table, times its group's ``s``."""
        codes = self._take(self.codes, rows)
        count = len(codes)
        levels = functional.embedding(codes.long(), level_table(dtype, codes.device))
        values = levels.view(count, -1)[:, : self.shape[1]]
        out = values.contiguous() if out is None else out.copy_(values)
        grouped = out.view(count, -1, self.group_size)
        grouped.mul_(self._take(self.scale, rows).to(dtype)[..., None])
        return out

    def matmul_t(self, hidden: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """``hidden @ Wᵀ`` (``(..., columns) → (..., rows)``), ``chunk`` rows (default ``chunk_rows``) decoded at a
        time into one reused buffer."""
        self.check_width(hidden)
        return self._chunked_matmul_t(hidden, chunk)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, ternary, group_size={self.group_size}"
