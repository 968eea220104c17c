"""The stored codes on ONNX Runtime's own quantized kernels: ``MatMulNBits`` (a product with a block-quantized
matrix) and ``GatherBlockQuantized`` (a lookup of block-quantized rows), both contrib ops of the ``com.microsoft``
domain that ONNX Runtime's CPU build ships.

Each is a torch custom op here (the form ``torch.export`` records) with a translation into the contrib op
(``TRANSLATIONS``, passed to ``torch.onnx.export``). The packed bytes go to the op as they are: ``lowbit.pack``
writes codes low bits first, 8 codes in ``bits`` bytes, which for 2, 4 and 8 bits is the ops' own layout; the
translation only reshapes the uint8 codes to ``(rows, blocks, bytes per block)``.

The library decodes ``x = code · scale + minimum`` (fp16 scale and minimum per group); the ops decode
``(code − zero_point) · scale``. Without a zero point input they subtract ``2^(bits−1)``, so the graph adds the rest:
``offset = minimum + 2^(bits−1) · scale`` per group, gathered for the looked-up rows, or for a product
``Σ_groups (Σ_{k∈group} x_k) · offset`` (one small ``MatMul`` with the per-group sums of ``x``). A float zero point
(``−minimum / scale``) would map directly, but ONNX Runtime 1.31 runs it on a slow unpacked path (20× the 4-bit
kernel, measured), and an integer zero point cannot hold the minimum.

What runs fast (ONNX Runtime 1.31.1 CPU, measured; ``docs/guide/deployment.md``): ``MatMulNBits`` with 4 bits and no
zero point; 2 and 8 bits run an unpacked fallback 10-50× slower than a float ``MatMul``, so only 4-bit products map.
``GatherBlockQuantized`` decodes 2, 4 and 8 bits exactly. Both need a block (the library's group) that is a power of
two of at least 16; 3-bit codes (8 codes in 3 bytes) have no ONNX Runtime kernel.

``MatMulNBits`` computes in fp32 by default (``accuracy_level`` 0, what PyTorch computes). ``accuracy_level=4``
(``ACCURACY_LEVELS``) lets it quantize the activations to int8 per block and use integer dot products: 2-4× faster on
this CPU, at outputs that differ from PyTorch's by the activations' rounding. It is ONNX Runtime's own attribute (its
GenAI model builder sets it for CPU int4 models).
"""

from __future__ import annotations

import onnx
import torch
from onnxscript import opset21 as op
from onnxscript.values import Op, Opset

from ...runtime.lowbit import unpack

#: The widths each op takes with the speed of a float ``MatMul`` or better (see the module docstring).
MATMUL_BITS, GATHER_BITS = (4,), (2, 4, 8)
#: ``MatMulNBits``' ``accuracy_level``: the lowest precision its products may compute in
ACCURACY_LEVELS = {0: "fp32 (unset)", 1: "fp32", 2: "fp16", 3: "bf16", 4: "int8 activations"}


def block_fits(group_size: int, columns: int) -> bool:
    """Whether the library's group is a block the contrib ops take (a power of two ≥ 16 dividing the columns)."""
    return group_size >= 16 and group_size & (group_size - 1) == 0 and columns % group_size == 0


def _codes(packed: torch.Tensor, bits: int, columns: int) -> torch.Tensor:
    """The centred codes the ops' eager forms compute with (``lowbit.unpack``: the runtime's own inverse of pack)."""
    return unpack(packed, bits, columns).float() - 2 ** (bits - 1)


@torch.library.custom_op("hf_tensorcompress_onnx::matmul_nbits", mutates_args=())
def matmul_nbits(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, columns: int, bits: int, accuracy_level: int
) -> torch.Tensor:
    """``x @ ((code − 2^(bits−1)) · scale)ᵀ`` (what ``MatMulNBits`` computes without a zero point; in fp32 whatever
    ``accuracy_level`` the graph's node gets)."""
    rows, groups = scale.shape
    weight = _codes(packed, bits, columns).reshape(rows, groups, -1) * scale[..., None]
    return x @ weight.reshape(rows, columns).T


@matmul_nbits.register_fake
def _(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, columns: int, bits: int, accuracy_level: int
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], scale.shape[0])


@torch.library.custom_op("hf_tensorcompress_onnx::gather_block_quantized", mutates_args=())
def gather_block_quantized(
    packed: torch.Tensor, ids: torch.Tensor, scale: torch.Tensor, columns: int, bits: int
) -> torch.Tensor:
    """Rows ``ids`` as ``(code − 2^(bits−1)) · scale`` (what ``GatherBlockQuantized`` computes on uint8 data)."""
    groups = scale.shape[1]
    rows = _codes(packed[ids], bits, columns).reshape(ids.shape[0], groups, -1) * scale[ids][..., None]
    return rows.reshape(ids.shape[0], columns)


@gather_block_quantized.register_fake
def _(packed: torch.Tensor, ids: torch.Tensor, scale: torch.Tensor, columns: int, bits: int) -> torch.Tensor:
    return scale.new_empty(ids.shape[0], columns)


_MICROSOFT = Opset("com.microsoft", 1)
_INPUT, _ATTRIBUTE, _INT = (
    onnx.defs.OpSchema.FormalParameter,
    onnx.defs.OpSchema.Attribute,
    onnx.defs.OpSchema.AttrType.INT,
)


def _contrib(name: str, inputs: list[tuple[str, str]], output: str, types: dict[str, str], attributes: list[str]) -> Op:
    """The contrib op as onnxscript calls it: a schema made here (the onnx package does not carry ONNX Runtime's
    contrib schemas), with the inputs this export passes, never registered globally."""
    schema = onnx.defs.OpSchema(
        name,
        _MICROSOFT.domain,
        _MICROSOFT.version,
        inputs=[_INPUT(input_name, type_name) for input_name, type_name in inputs],
        outputs=[_INPUT("Y", output)],
        type_constraints=[(type_name, [allowed], "") for type_name, allowed in types.items()],
        attributes=[_ATTRIBUTE(attribute, _INT, "") for attribute in attributes],
    )
    return Op(_MICROSOFT, name, schema)


_MATMUL_NBITS = _contrib(
    "MatMulNBits",
    [("A", "T1"), ("B", "T2"), ("scales", "T1")],
    "T1",
    {"T1": "tensor(float)", "T2": "tensor(uint8)"},
    ["K", "N", "bits", "block_size", "accuracy_level"],
)
_GATHER_BLOCK_QUANTIZED = _contrib(
    "GatherBlockQuantized",
    [("data", "T1"), ("indices", "Tind"), ("scales", "T2")],
    "T2",
    {"T1": "tensor(uint8)", "Tind": "tensor(int64)", "T2": "tensor(float)"},
    ["bits", "block_size", "gather_axis", "quantize_axis"],
)


def _matmul_nbits_onnx(x, packed, scale, columns: int, bits: int, accuracy_level: int):
    rows, groups = scale.shape
    blocks = op.Reshape(packed, op.Constant(value_ints=[rows, groups, columns // groups * bits // 8]))
    flat_scale = op.Reshape(scale, op.Constant(value_ints=[-1]))
    block = columns // groups
    return _MATMUL_NBITS(
        x, blocks, flat_scale, K=columns, N=rows, bits=bits, block_size=block, accuracy_level=accuracy_level
    )


def _gather_block_quantized_onnx(packed, ids, scale, columns: int, bits: int):
    block = columns // scale.shape[1]
    return _GATHER_BLOCK_QUANTIZED(packed, ids, scale, bits=bits, block_size=block, gather_axis=0, quantize_axis=1)


#: custom op → its contrib-op translation (``torch.onnx.export(custom_translation_table=...)``)
TRANSLATIONS = {
    torch.ops.hf_tensorcompress_onnx.matmul_nbits.default: _matmul_nbits_onnx,
    torch.ops.hf_tensorcompress_onnx.gather_block_quantized.default: _gather_block_quantized_onnx,
}
