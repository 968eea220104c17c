"""Bits packed 8 per byte, most significant first: Biprop's mask and sign bits, a rotated low-bit Linear's input signs,
1-bit weight codes (``lowbit.pack``).

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """A bool/0-1 tensor flattened and packed 8 per byte (most significant first) into uint8."""
    flat = bits.reshape(-1).to(torch.uint8)
    flat = F.pad(flat, (0, (-flat.numel()) % 8))
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=flat.device)
    return (flat.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: the first ``numel`` bits as a bool tensor."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    return ((packed.view(-1, 1) >> shifts) & 1).reshape(-1)[:numel].bool()
