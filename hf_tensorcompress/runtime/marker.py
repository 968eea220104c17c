"""What a compressed checkpoint's ``config.json`` says to transformers: ``quantization_config`` names this library's
quantizer (``QUANT_METHOD``). Plain data, no torch: the configs and the command line read it too."""

from __future__ import annotations

#: ``config.json``'s ``quantization_config`` of a compressed checkpoint: where hf_tensorcompress is imported,
#: transformers hands the checkpoint to the registered ``tensorcompress`` quantizer (``quantizer.py``), which
#: rebuilds the layers from ``compression_config`` (the specs stay there, in one place).
QUANT_METHOD = "tensorcompress"
QUANTIZATION_MARKER = {"quant_method": QUANT_METHOD, "version": 1}
#: Where the marker nests the config of the quantizer of the model's other ``nn.Linear`` weights (torchao's
#: ``TorchAoConfig.to_dict()``: ``runtime/torchao_linears.py``); such a marker is version ``STACKED_VERSION``, so a
#: library that predates it refuses the checkpoint instead of loading its Linear weights at random.
LINEARS_KEY = "linears"
STACKED_VERSION = 2


def marker_version_problem(version: object) -> str | None:
    """What is wrong with a checkpoint's ``quantization_config["version"]`` (None: nothing): this library writes 1,
    or ``STACKED_VERSION`` with quantized Linears; any other value was edited, or a newer library wrote it, whose
    checkpoint this code cannot read right."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return (
            f"config.json: quantization_config['version'] is {version!r}, not a version this library writes (1, or "
            f"{STACKED_VERSION} with quantized Linears); restore config.json from the saved checkpoint"
        )
    if version > STACKED_VERSION:
        return (
            f"config.json: quantization_config['version'] is {version}, newer than this hf_tensorcompress reads "
            f"(up to {STACKED_VERSION}): upgrade hf_tensorcompress, or restore config.json if it was edited"
        )
    return None


def quantization_marker(linears: dict | None = None) -> dict:
    """A compressed checkpoint's ``quantization_config``: ``QUANTIZATION_MARKER``, or, with ``linears`` (the nested
    config of its quantized Linear weights), the version-``STACKED_VERSION`` marker holding it."""
    if linears is None:
        return dict(QUANTIZATION_MARKER)
    return {"quant_method": QUANT_METHOD, "version": STACKED_VERSION, LINEARS_KEY: linears}


#: Bit widths stored as packed integer codes (``LowBitTensor``'s packed widths; TT storage takes these).
FACTOR_BITS = (2, 3, 4, 8)
#: The ternary factor width: BitNet b1.58 levels {-s, 0, +s} per group, stored five codes a byte (1.6 bits).
TERNARY = "ternary"
#: Widths the low-rank layers' (CP, SVD) factors and the low-bit Linears' weights can be stored in: 16 is bfloat16
#: values (``LowBitTensor``'s 16-bit form), 8 … 2 packed round-to-nearest codes, ``TERNARY`` three levels per group,
#: five codes a byte, 1 a sign per value with one level per group, eight codes a byte.
FACTOR_WIDTHS = (16, 8, 4, 3, 2, TERNARY, 1)


def check_factor_storage(bits: int | str | None, group_size: int | None) -> None:
    """A config's ``factor_bits`` / ``factor_group_size``, with an error naming the allowed values."""
    if bits is not None and (isinstance(bits, bool) or bits not in FACTOR_WIDTHS):
        raise ValueError(f"factor_bits={bits!r}: choose one of {list(FACTOR_WIDTHS)}, or None for fp32 factors")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"factor_group_size={group_size!r} must be an int >= 1 (columns per scale group) or None")


#: A low-bit Linear's ``input_rotation``: ``"none"``, the inputs as they come; ``"hadamard"``, each block of
#: ``rotation_block`` inputs multiplied by a Hadamard matrix before the weight; ``"randomized-hadamard"``, by random
#: signs first (QuIP#, QuaRot). The layer is ``methods/lowbit/rotation.py``.
INPUT_ROTATIONS = ("none", "hadamard", "randomized-hadamard")


def check_rotation_block(block: object) -> int:
    """``block`` as a rotation's block size: a power of two ≥ 2 (Sylvester's construction has no other sizes)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block & (block - 1):
        raise ValueError(f"rotation_block={block!r} must be a power of two >= 2 (a Hadamard matrix's size), e.g. 128")
    return block
