"""Hadamard rotation of a low-bit Linear's inputs: the ``input_rotation`` option (``"hadamard"``,
``"randomized-hadamard"``).

A feature that carries much of a layer's signal makes one column of every group hold it, which a ternary or 2-bit
group rounds badly. Multiplying each block of the inputs by a Hadamard matrix (after random signs, randomized)
spreads every feature over the whole block; the weight trains (or is copied) in that rotated basis, so the layer
computes what it would have, but its groups round incoherent columns: QuIP#'s and QuaRot's incoherence processing
(Tseng et al., 2024; Ashkboos et al., 2024), which rotate a trained LLM's weights before rounding them, here also
trained in the rotated basis from the first step.

The matrix is Sylvester's (entries ±1/√block, symmetric, its own inverse), rebuilt from the block size. The signs
(all +1 for ``"hadamard"``; drawn from a seed for ``"randomized-hadamard"``, so a model compressed on load has the
signs ``apply_compression`` gives it) are stored, one bit an input (``bit_packing``), a row of bytes a block, so a
checkpoint holds its rotation in its tensors: a spec that lost the option finds an extra tensor, one with another
block size a tensor of another shape, and either is refused, where a weight read in the wrong basis would run and
forecast wrong. Hand-written: none of this project's dependencies rotates a Linear's inputs in a saved model
(torchao's SpinQuant prototype rotates a trained Llama and fuses the rotation away, which a layer between
normalisation and attention allows but PatchTST's Linears do not all do).

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ...runtime.bit_packing import pack_bits, unpack_bits
from ...runtime.contract import TensorProblem
from ...runtime.marker import check_rotation_block


@functools.cache
def sylvester(size: int) -> torch.Tensor:
    """The ``size × size`` Hadamard matrix of Sylvester's construction over √size (fp32, on the CPU: callers move a
    copy); orthogonal and symmetric."""
    check_rotation_block(size)
    matrix = torch.ones(1, 1)
    while len(matrix) < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)])
    return matrix / size**0.5


class InputRotation(nn.Module):
    """``x ↦ x R``, ``R`` block-diagonal with blocks ``diag(s_k) H``: ``s`` the stored signs, ``H`` Sylvester's.

    A weight ``W`` of the inputs' own basis computes the same outputs in the rotated one as ``W R`` (``rotate``, the
    same map on its rows); ``unrotate`` takes a rotated weight back (``W R Rᵀ = W``)."""

    def __init__(self, features: int, block: int, seed: int | None = None, device: torch.device | None = None) -> None:
        super().__init__()
        self.seed = seed
        self.block = check_rotation_block(block)
        if features % block:
            raise ValueError(f"a rotation in blocks of {block} needs inputs a multiple of {block}; this has {features}")
        self.features = features
        shape = (features // block, -(-block // 8))  # a row a block: a spec with another block has another shape
        self.register_buffer("signs", torch.zeros(shape, dtype=torch.uint8, device=device))

    @torch.no_grad()
    def draw(self) -> None:
        """The signs ``seed`` gives (a generator of their own: torch's global one is left as it was); all +1 without
        a seed."""
        if self.signs.is_meta:
            return
        shape = (len(self.signs), self.block)
        if self.seed is None:
            bits = torch.ones(shape, dtype=torch.uint8)
        else:
            generator = torch.Generator().manual_seed(self.seed)
            bits = torch.randint(0, 2, shape, generator=generator, dtype=torch.uint8)
        padded = torch.nn.functional.pad(bits, (0, self.signs.shape[1] * 8 - self.block))
        self.signs.copy_(pack_bits(padded).view(self.signs.shape).to(self.signs.device))

    def sign_bits(self) -> torch.Tensor:
        """``(blocks, bytes · 8)``: each block's sign bits and the padding after them."""
        return unpack_bits(self.signs, self.signs.numel() * 8).view(len(self.signs), -1)

    def sign_values(self, dtype: torch.dtype) -> torch.Tensor:
        """The signs as ±1 of ``dtype``, one per input."""
        return self.sign_bits()[:, : self.block].reshape(-1).to(dtype) * 2 - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x R``: each block of the last dimension times its signs, then ``H``."""
        blocks = (x * self.sign_values(x.dtype)).unflatten(-1, (-1, self.block))
        return (blocks @ sylvester(self.block).to(x)).flatten(-2)

    def rotate(self, weight: torch.Tensor) -> torch.Tensor:
        """``W R``: an ``(out, in)`` weight of the inputs' own basis as the rotated layer holds it."""
        return self(weight)

    def unrotate(self, weight: torch.Tensor) -> torch.Tensor:
        """``W Rᵀ``: a rotated layer's ``(out, in)`` weight in the inputs' own basis (what the layer computes)."""
        blocks = weight.unflatten(-1, (-1, self.block)) @ sylvester(self.block).to(weight)
        return blocks.flatten(-2) * self.sign_values(weight.dtype)

    def check_state(self) -> None:
        """No sign bits in the padding past each block (a saved rotation leaves it 0)."""
        if not self.signs.is_meta and self.sign_bits()[:, self.block :].any():
            raise TensorProblem(
                "signs", f"holds bits past a block's {self.block} inputs, in the padding that is always 0"
            )

    def extra_repr(self) -> str:
        return f"features={self.features}, block={self.block}"
