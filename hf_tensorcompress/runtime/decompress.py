"""Back to dense: a compressed model becomes a plain model of its transformers class, each compressed layer replaced
by the dense module it stands for, with the weight the layer computes.

The dense modules are taken from a model of the base class built on the meta device from the same config, so their
types and layouts are the original's (``nn.Linear``, GPT-2's ``Conv1D``, Gemma's scaled embedding); a tied output
layer is tied again. What is saved afterwards is an ordinary transformers checkpoint.

Ships inside saved checkpoints (``Compressed<Base>.dequantize()``): torch and transformers only.
"""

from __future__ import annotations

import torch
from torch import nn

from .contract import CompressedLayer
from .optional import sibling
from .structure import CompressedCheckpointError, active_options

#: ``config.json`` entries that only a compressed checkpoint has.
COMPRESSION_ENTRIES = ("compression_config", "quantization_config")


def base_class(model: nn.Module) -> type[nn.Module]:
    """The transformers class under ``Compressed<Base>`` (the first class of the MRO that is not a compressed one)."""
    return next(
        cls for cls in type(model).__mro__ if not any(c.__name__ == "CompressedModelMixin" for c in cls.__mro__)
    )


def strip_compression(config) -> None:
    """Remove, in place, the compression entries and the ``auto_map`` lines pointing at the shipped code."""
    for entry in COMPRESSION_ENTRIES:
        if hasattr(config, entry):
            delattr(config, entry)
    auto_map = {
        key: value
        for key, value in (getattr(config, "auto_map", None) or {}).items()
        if not value.startswith("modeling_tensorcompress.")
    }
    if auto_map:
        config.auto_map = auto_map
    elif hasattr(config, "auto_map"):
        delattr(config, "auto_map")


@torch.no_grad()
def decompress(model: nn.Module) -> nn.Module:
    """Turn ``model`` (compressed by any method) into the dense model of its base class, in place, and return it.

    Every compressed layer is rebuilt into the dense module it replaced, and torchao-quantized Linear weights become
    float weights; the outputs stay those of the compressed model (up to float rounding). A model whose method
    changed more than its layers (biprop's attention options) is refused before anything changes."""
    compression = getattr(model.config, "compression_config", None)
    if not isinstance(compression, dict) or not isinstance(compression.get("modules"), dict):
        raise ValueError(f"{type(model).__name__} is not compressed (its config has no compression_config)")
    base = base_class(model)
    for option in active_options(compression):
        reason = option.dense_equivalent(compression)
        if reason is not None:
            raise ValueError(reason.format(base=base.__name__))
    layers = {name: model.get_submodule(name) for name in compression["modules"]}
    wrong = [name for name, layer in layers.items() if not isinstance(layer, CompressedLayer)]
    if wrong:
        raise CompressedCheckpointError(f"compression_config lists {wrong[0]!r}, but that module is not compressed")
    adapter = sibling("torchao_linears")
    if adapter is not None:  # a checkpoint without it has no quantized Linears
        adapter.dense_linears(model)
    config = model.config.__class__.from_dict(model.config.to_dict())
    strip_compression(config)
    if any(getattr(layer, "tied_output", None) for layer in layers.values()):
        config.get_text_config().tie_word_embeddings = True
    with torch.device("meta"):
        reference = base(config)
    for name, layer in layers.items():
        weight = layer.dense_weight()
        dense = reference.get_submodule(name).to_empty(device=weight.device).to(weight.dtype)
        layer.fill_dense(dense)
        model.set_submodule(name, dense)
        layer.unbind(model, reference)
    model.__class__ = base
    strip_compression(model.config)  # in place: sub-models hold the same config object
    tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
    if tied:
        model.config.get_text_config().tie_word_embeddings = True
    if hasattr(reference, "all_tied_weights_keys"):
        model.all_tied_weights_keys = reference.all_tied_weights_keys
    if tied:
        model.tie_weights()
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # quantized Linears, now dense: nothing is quantized any more
        quantizer.remove_quantization_config(model)
    return model
