"""Load a saved model folder (dense or compressed) or a GGUF file with this library's classes.

``AutoModel.from_pretrained(folder, trust_remote_code=True)`` would give the copy of the modeling code stored in the
folder; here a compressed folder loads as this library's ``Compressed<Class>``, so saving and pushing it again
writes the model card. Errors name what was expected.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import transformers
from torch import nn

from .config import CompressionConfig
from .core.extras import require
from .quantizer import check_method
from .runtime.atomic import recover
from .runtime.modeling_tensorcompress import CLASS_PREFIX
from .saving import library_class
from .stacking import release_gguf


class ModelLoadError(ValueError):
    """A path that is not a loadable model folder or GGUF file."""


def model_class(folder: Path) -> type[nn.Module]:
    """The transformers class (or its ``Compressed`` subclass) named by ``folder/config.json``'s architectures."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{folder} has no config.json; pass a folder written by save_pretrained or a .gguf file")
    data = json.loads(config_file.read_text(encoding="utf-8"))
    if isinstance(data.get("compression_config"), dict):  # its method's layer types must be registered before loading
        check_method(data["compression_config"])
    architectures = data.get("architectures") or []
    if not architectures:
        raise ModelLoadError(f"{config_file} names no architectures; cannot tell which model class to load")
    name = architectures[0]
    base_name = name.removeprefix(CLASS_PREFIX)
    base = getattr(transformers, base_name, None)
    if not (isinstance(base, type) and issubclass(base, transformers.PreTrainedModel)):
        raise ModelLoadError(f"{config_file} names {name!r}, which is not a transformers model class")
    return library_class(base) if name.startswith(CLASS_PREFIX) else base


def load_model(path: str | Path) -> nn.Module:
    """A model from a ``save_pretrained`` folder (a compressed one as this library's class), or a causal LM from a
    ``.gguf`` file with its weights dequantised to plain float tensors, so it compresses and saves like any other
    model (what ``hf-tensorcompress compress`` loads; ``from_pretrained(..., gguf_file=...)`` may keep GGUF-packed
    weights, which cannot be compressed)."""
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        require("gguf", "loading a GGUF file")
        # Every weight dequantised to a plain tensor (compressed layers replace float weights), then the GGUF
        # quantizer dropped: transformers refuses to save a model that still carries it.
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, quantization_config=transformers.GgufConfig(dequantize=True)
        )
        release_gguf(model)
        return model
    with contextlib.suppress(OSError):  # a save killed mid-way: its previous folder back first
        recover(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path} does not exist; pass a model folder (with config.json) or a .gguf file")
    model = model_class(path).from_pretrained(str(path))
    recorded = getattr(model.config, "compression_config", None)
    if recorded:  # an older version's config reads as the method's own config, and saves as the current version
        model.config.compression_config = CompressionConfig.from_dict(recorded).to_dict()
    return model


def gguf_provenance(path: str | Path) -> tuple[str | None, str]:
    """(best-guess Hub id of the original model, one-line note on the quantisation) from a GGUF file's metadata."""
    gguf = require("gguf", "reading a GGUF file")
    GGUFReader, LlamaFileType = gguf.GGUFReader, gguf.LlamaFileType

    reader = GGUFReader(str(path))

    def field(name: str):
        entry = reader.fields.get(name)
        return entry.contents() if entry is not None else None

    organization = field("general.organization")
    base_model = f"{organization}/{Path(path).name.split('.')[0]}" if organization else None
    file_type = field("general.file_type")
    quant = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else "quantised"
    note = (
        f"Weights come from the {quant} GGUF file `{Path(path).name}`: they are dequantised {quant} values, not the "
        "original full-precision weights, so quality differs slightly from the original model."
    )
    return base_model, note
