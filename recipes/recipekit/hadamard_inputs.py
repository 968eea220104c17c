"""The ``-hadamard`` option of the ``ends-<bits>-<bits>`` arms: every Linear's input rotated by a Hadamard matrix, a
block of 128 features at a time, before its low-bit weight multiplies it.

Rotating a layer's inputs spreads a feature that carries much of the signal over the whole block, so that no single
column of a ternary group has to hold it: the incoherence processing of QuIP# (Tseng et al., 2024) and QuaRot
(Ashkboos et al., 2024), which rotate a trained LLM's weights before rounding them. Here the weights train in the
rotated basis from the first step. The matrix is Sylvester's (entries ±1/√128, its own inverse), fixed, so it costs no
stored bytes; the block matches the weights' groups of 128. A Linear whose inputs are not a whole number of blocks
(PatchTST's input embedding, 24 features a patch) is left as it is. Hand-written, as a forward pre-hook: none of this
project's dependencies trains a Linear in a rotated basis (torchao's SpinQuant prototype rotates a trained Llama)."""

from __future__ import annotations

import torch

#: Features a rotation mixes: the weights' scale groups (``byte_arms.ROWS_GROUP``).
BLOCK = 128


def sylvester(size: int) -> torch.Tensor:
    """The ``size × size`` Hadamard matrix of Sylvester's construction over √size: orthogonal and symmetric."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester Hadamard matrix has a power of two rows; {size} is not one")
    matrix = torch.ones(1, 1)
    while len(matrix) < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)])
    return matrix / size**0.5


def rotate_inputs(linear: torch.nn.Module, block: int = BLOCK) -> None:
    """Rotate ``linear``'s inputs, a block of ``block`` features at a time, from now on; nothing where its
    ``in_features`` is not a multiple of ``block``."""
    if linear.in_features % block:
        return
    matrix = sylvester(block)

    def rotated(module: torch.nn.Module, inputs: tuple) -> tuple:
        x = inputs[0]
        return ((x.unflatten(-1, (-1, block)) @ matrix.to(x)).flatten(-2), *inputs[1:])

    linear.register_forward_pre_hook(rotated)
