"""What a model takes on disk before and after compression, and the precision its uncompressed parts keep.

A user who asks for a smaller model must get one: the parts a method does not compress keep the source's
precision (bf16 when the source is bf16 or a GGUF file, whose block weights are 4–8-bit), and the command line ends
with the bytes that went in and came out, naming what dominates the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: Files that hold a checkpoint's weights.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def source_dtype(source: str | Path) -> torch.dtype:
    """The precision of a source's weights: bf16 for a GGUF file (dequantized 4–8-bit values need no more than
    that for the parts left uncompressed), else the ``dtype`` its ``config.json`` records (float32 if none)."""
    source = Path(source)
    if source.suffix == ".gguf":
        return torch.bfloat16
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return DTYPES.get(str(name), torch.float32)


def weight_bytes(path: str | Path) -> int:
    """Bytes of a GGUF file, or of the weight files of a model folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(file.stat().st_size for pattern in WEIGHT_PATTERNS for file in path.glob(pattern))


def bytes_by_part(folder: str | Path) -> dict[str, int]:
    """Bytes of a saved checkpoint's tensors: the compressed modules' in one entry, the quantized Linears' (their
    packed codes and scales) in another, the rest by dtype (from the safetensors headers, nothing loaded)."""
    from safetensors import safe_open

    from ..runtime.checkpoint_files import stored_metadata
    from ..runtime.checks import torchao_weights

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    compressed = tuple(f"{name}." for name in (config.get("compression_config") or {}).get("modules", {}))
    linears = (config.get("quantization_config") or {}).get("linears") or {}
    torchao = {key for weight in torchao_weights(stored_metadata(folder)).values() for key in weight.parts.values()}
    parts: dict[str, int] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            keys = list(handle.keys())
            packed = tuple(key.split(BNB_STATE)[0] + ".weight" for key in keys if BNB_STATE in key)
            for key in keys:
                view = handle.get_slice(key)
                size = torch.Size(view.get_shape()).numel() * _element_size(view.get_dtype())
                if key.startswith(compressed):
                    part = "compressed modules"
                elif key in torchao or key.startswith(packed):
                    part = f"quantized Linears ({_linears_name(linears)}: packed codes and scales)"
                else:
                    part = f"uncompressed {view.get_dtype()}"
                parts[part] = parts.get(part, 0) + size
    return parts


#: What a bitsandbytes 4-bit Linear's packed quant state is saved under, after its module name.
BNB_STATE = ".weight.quant_state.bitsandbytes__"


def _linears_name(linears: dict) -> str:
    """The quantization of a checkpoint's Linears as a reader knows it: bitsandbytes NF4 / FP4, torchao's config."""
    if linears.get("quant_method") == "bitsandbytes":
        return f"bitsandbytes {str(linears.get('bnb_4bit_quant_type', '4-bit')).upper()}"
    quant_type = linears.get("quant_type")
    name = quant_type.get("default", {}).get("_type") if isinstance(quant_type, dict) else None
    return f"torchao {name}" if name else "torchao"


def _element_size(safetensors_dtype: str) -> int:
    """Bytes per element of a safetensors dtype name (``F32``, ``BF16``, ``U8``, ``I64``, ``F8_E4M3`` …)."""
    digits = "".join(character for character in safetensors_dtype.split("_")[0] if character.isdigit())
    return max(1, int(digits or 8) // 8)


def size_line(source: str | Path, output: str | Path) -> str:
    """One line: input bytes → output bytes on disk, and the part of the output that dominates."""
    before, after = weight_bytes(source), weight_bytes(output)
    parts = bytes_by_part(output)
    largest = max(parts, key=parts.get) if parts else "nothing"
    share = parts.get(largest, 0) / max(1, sum(parts.values()))
    return (
        f"size on disk: {Path(source).name} {before / 1e6:,.1f} MB -> {Path(output).name} {after / 1e6:,.1f} MB "
        f"({after / max(1, before):.2f}x the input); {largest} hold {share:.0%} of it"
    )
