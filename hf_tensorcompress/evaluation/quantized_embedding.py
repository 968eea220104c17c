"""Weight-only quantization of a token embedding through maintained libraries: the yardstick every embedding option
is compared against at equal bytes.

Each arm quantizes a ``(V, d)`` matrix the way its library stores it and returns what a lookup would read (the
dequantized matrix) and the bytes the library keeps (codes, scales, zero points, nested statistics; on disk and in
memory alike). Libraries: torchao ``IntxWeightOnlyConfig`` (int8 per row; int4 groups of 64, which torchao stores
unpacked in int8 bytes on x86), bitsandbytes ``Embedding8bit`` / ``Embedding4bit`` / ``EmbeddingNF4`` (packed on
CPU, blocks of 64), gguf ``Q8_0`` / ``Q5_0`` / ``Q4_1`` / ``Q4_0`` (blocks of 32). None of them stores 3 or 2 bits
on CPU, so those arms (``rtn-*``) are round-to-nearest written here (``runtime.lowbit.LowBitTensor``, asymmetric, an
fp16 scale and minimum per group); ``rtn-int4-g64`` is the same at 4 bits, the issue's int4 yardstick.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..core.extras import require
from ..runtime.lowbit import LowBitTensor

#: ``(weight) -> (dequantized weight, stored bytes)``
Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, int]]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def torchao_arm(bits: int, group_size: int | None) -> Quantizer:
    def run(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
        quantization = require("torchao.quantization", "the torchao quantization arms")
        granularity = require("torchao.quantization.granularity", "the torchao quantization arms")
        embedding = nn.Embedding(*weight.shape, _weight=weight.detach().float().clone())
        holder = nn.Sequential(embedding)
        grain = granularity.PerAxis(0) if group_size is None else granularity.PerGroup(group_size)
        dtype = {8: torch.int8, 4: torch.int4}[bits]
        quantization.quantize_(
            holder,
            quantization.IntxWeightOnlyConfig(weight_dtype=dtype, granularity=grain),
            filter_fn=lambda module, _: isinstance(module, nn.Embedding),
        )
        stored = holder[0].weight
        names, _ = stored.__tensor_flatten__()
        return stored.dequantize().float(), _nbytes(getattr(stored, name) for name in names)

    return run


def bitsandbytes_arm(kind: str) -> Quantizer:
    def run(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
        bnb = require("bitsandbytes", "the bitsandbytes quantization arms")
        vocab, hidden = weight.shape
        data = weight.detach().float().cpu().clone()
        if kind == "int8":
            module = bnb.nn.Embedding8bit(vocab, hidden)
            module.weight = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)
            module = module.to("cpu")  # quantizes: int8 codes + one fp32 absmax per row (SCB)
            return module(torch.arange(vocab)).float(), _nbytes([module.weight.data, module.weight.SCB])
        module = bnb.nn.Embedding4bit(vocab, hidden, quant_type=kind)
        module.weight = bnb.nn.Params4bit(data, requires_grad=False, quant_type=kind, blocksize=64)
        module = module.to("cpu")  # quantizes: two codes a byte + nested (double-quantized) absmax per block of 64
        state = module.weight.quant_state.as_dict(packed=True)
        return module(torch.arange(vocab)).float(), _nbytes([module.weight.data, *state.values()])

    return run


def gguf_arm(kind: str) -> Quantizer:
    def run(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
        gguf = require("gguf", "the GGUF quantization arms")
        quant_type = getattr(gguf.GGMLQuantizationType, kind)
        packed = gguf.quants.quantize(weight.detach().float().cpu().numpy(), quant_type)
        values = torch.from_numpy(gguf.quants.dequantize(packed, quant_type).copy()).float()
        return values.reshape(weight.shape), int(packed.nbytes)

    return run


def rtn_arm(bits: int, group_size: int) -> Quantizer:
    def run(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
        stored = LowBitTensor.quantize(weight.detach().float(), bits, group_size)
        return stored.dequantize(), stored.storage_bits() // 8

    return run


#: name -> (quantizer, library). Names say the library, the width and the block/group.
QUANT_ARMS: dict[str, tuple[Quantizer, str]] = {
    "torchao-int8-row": (torchao_arm(8, None), "torchao"),
    "torchao-int4-g64": (torchao_arm(4, 64), "torchao"),
    "bnb-int8-row": (bitsandbytes_arm("int8"), "bitsandbytes"),
    "bnb-nf4-b64": (bitsandbytes_arm("nf4"), "bitsandbytes"),
    "bnb-fp4-b64": (bitsandbytes_arm("fp4"), "bitsandbytes"),
    "gguf-q8_0": (gguf_arm("Q8_0"), "gguf"),
    "gguf-q5_0": (gguf_arm("Q5_0"), "gguf"),
    "gguf-q4_1": (gguf_arm("Q4_1"), "gguf"),
    "gguf-q4_0": (gguf_arm("Q4_0"), "gguf"),
    "rtn-int4-g64": (rtn_arm(4, 64), "hand-written round-to-nearest"),
    "rtn-int3-g64": (rtn_arm(3, 64), "hand-written round-to-nearest"),
    "rtn-int3-g192": (rtn_arm(3, 192), "hand-written round-to-nearest"),
    "rtn-int2-g64": (rtn_arm(2, 64), "hand-written round-to-nearest"),
}


@torch.no_grad()
def quantize_embedding(model: nn.Module, arm: str) -> int:
    """Replace ``model``'s (tied) input embedding values by arm ``arm``'s quantized ones in place; returns the bytes
    the arm stores. The matrix stays a float parameter (what a lookup and the tied head read); the bytes are the
    library's storage."""
    if arm not in QUANT_ARMS:
        raise ValueError(f"quantization arm {arm!r} is unknown; choose one of {sorted(QUANT_ARMS)}")
    weight = model.get_input_embeddings().weight
    values, stored = QUANT_ARMS[arm][0](weight)
    weight.copy_(values.to(weight))
    return stored
