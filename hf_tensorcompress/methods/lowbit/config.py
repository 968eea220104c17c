"""Options of ``method="lowbit"`` (full-rank Linear weights stored in a few bits, trained quantization-aware)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...config import CompressionConfig, check_choice, check_int, one_of
from ...runtime.marker import FACTOR_WIDTHS, INPUT_ROTATIONS, check_rotation_block

#: ``"rounded"``: each group's scale (and minimum) taken from the weights' present values at every step (their range;
#: the least-squares level for ternary); ``"learned"``: trained as parameters, from those values on (LSQ).
WEIGHT_SCALES = ("rounded", "learned")

#: ``"copy"``: start from the dense weights (a fresh model trains from scratch, a trained one goes on from there);
#: ``"random"``: ``nn.Linear``'s own init (what a model built on the meta device needs: no weights to read).
LOWBIT_INITS = ("copy", "random")

#: ``"model"``: the bias kept in the model's dtype; ``"float16"``: stored (and trained, straight-through) in fp16,
#: which at ternary widths frees a tenth of a small model's bytes for wider weights elsewhere.
BIAS_DTYPES = ("model", "float16")


@dataclass
class LowBitConfig(CompressionConfig):
    """Each target Linear keeps its full ``out × in`` weight, stored in ``bits`` with one scale per group.

    Args:
        target_modules: ``None`` or ``"all-linear"`` (every Linear but a language model's output head), names, or a
            regex.
        weight_bits: the stored width of every weight: 8, 4, 3 or 2 (round-to-nearest codes with an fp16 scale and
            minimum per group), ``"ternary"`` (BitNet b1.58's levels {-s, 0, +s} per group, five codes a byte: 1.6
            bits and one fp16 s per group), 1 (a sign per weight, the levels ±a of each group at a = mean|x|, eight
            codes a byte, an fp16 scale and minimum per group: 1.25 bits a weight in groups of 128) or 16 (bfloat16).
        weight_group_size: input columns per scale/minimum group (``None``, or a size that does not divide a layer's
            inputs: one group per output row). Larger groups cost fewer bytes: at 2 bits, 32 → 3 bits a weight, 128
            → 2.25.
        init: ``"copy"`` (the dense weights, rounded) or ``"random"`` (``nn.Linear``'s init).
        weight_scales: ``"rounded"`` (each group's scale and minimum from the weights' range at every step; for
            ternary, the least-squares level) or ``"learned"`` (trained with the weights, starting there: LSQ, with
            a learned minimum; the scales' gradients scaled by ``1/sqrt(group · top code)``). The saved form is the
            same either way.
        bias_dtype: ``"model"`` (the bias as the model holds it: fp32 or bf16) or ``"float16"`` (trained as fp16
            rounds it, straight-through, and saved and loaded in fp16: half an fp32 bias's bytes, which matter once
            the weights take a bit or two: PatchTST's biases are a tenth of its ternary Linears' bytes).
        input_rotation: ``"none"``, ``"hadamard"`` or ``"randomized-hadamard"``: each block of ``rotation_block``
            inputs multiplied by Sylvester's Hadamard matrix (randomized: by random signs first, as QuIP# and QuaRot
            do) before the weight, which then trains (or is copied) in that rotated basis. Every group rounds
            columns that no single input dominates. The signs are stored, one bit an input (all +1 unrandomized); a
            Linear whose inputs are not a multiple of the block is left unrotated, with a warning.
        rotation_block: inputs a rotation mixes, a power of two (the weights' group size is the natural choice).
        rotation_seed: the seed ``"randomized-hadamard"`` draws its signs from (every Linear of a width draws the
            same signs).

    The layer trains fp32 weights and computes with them rounded exactly as they will be stored (straight-through
    gradients), so training with it is quantization-aware training; saved, it holds only the packed codes, on disk
    and, once loaded, in memory.
    """

    method: str = "lowbit"
    weight_bits: int | str = one_of(4, FACTOR_WIDTHS)
    weight_group_size: int | None = 32
    init: str = "copy"  # not a one_of: --init is one flag of several methods, each with its own values
    weight_scales: str = one_of("rounded", WEIGHT_SCALES)
    bias_dtype: str = one_of("model", BIAS_DTYPES)
    input_rotation: str = one_of("none", INPUT_ROTATIONS)
    rotation_block: int = 128
    rotation_seed: int = 0

    method_name: ClassVar[str] = "lowbit"

    def validate(self) -> None:
        super().validate()
        if isinstance(self.weight_bits, bool) or self.weight_bits not in FACTOR_WIDTHS:
            raise ValueError(
                f"weight_bits={self.weight_bits!r} is not a stored width; choose one of {list(FACTOR_WIDTHS)}"
            )
        if self.weight_group_size is not None:
            check_int(self.weight_group_size, "weight_group_size", 1, " (input columns per scale group) or None")
        check_choice(self.init, "init", LOWBIT_INITS)
        check_choice(self.weight_scales, "weight_scales", WEIGHT_SCALES)
        check_choice(self.bias_dtype, "bias_dtype", BIAS_DTYPES)
        check_choice(self.input_rotation, "input_rotation", INPUT_ROTATIONS)
        check_rotation_block(self.rotation_block)
        check_int(self.rotation_seed, "rotation_seed", 0)
        if self.weight_scales == "learned" and self.weight_bits == 16:
            raise ValueError(
                "weight_scales='learned' trains group scales, and weight_bits=16 (bfloat16) has none; "
                "choose weight_bits 8, 4, 3, 2, 'ternary' or 1, or weight_scales='rounded'"
            )
