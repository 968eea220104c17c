"""Compressed layers beside torchao-quantized ``nn.Linear`` weights: one checkpoint, one ``quantization_config``.

transformers keeps one ``quantization_config`` per model. A compressed model whose Linear weights torchao quantized
records torchao's own config (``TorchAoConfig.to_dict()``) inside the library's marker, under ``LINEARS_KEY``
(marker version ``STACKED_VERSION``). transformers' ``TorchAoHfQuantizer`` does the torchao part both ways:
loading, it rebuilds the Linear weights from their flattened tensors and the safetensors metadata (the library's
quantizer delegates to it; where the library is not installed, ``Compressed<Base>.from_pretrained`` gives it the
nested config); saving, torchao flattens its tensor subclasses, and ``TorchAoLinears`` adds the tombstones.

Ships inside saved checkpoints: torch and transformers; torchao only where a checkpoint has quantized Linears, and
then through ``torchao_module`` alone: transformers refuses to load a Hub checkpoint's remote code while any import
statement outside a ``try`` block of any shipped file names a package that is not installed.
"""

from __future__ import annotations

import copy
import importlib
from types import ModuleType

import torch
from torch import nn
from transformers import PretrainedConfig, TorchAoConfig
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
from transformers.quantizers.quantizer_torchao import TorchAoHfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from .bnb_linears import BnbLinears, bitsandbytes_module, bnb_quantizer, dense_bnb_linears, is_bnb
from .contract import LINEARS_KEY, QUANT_METHOD, SIGNPOST_KEY, quantization_marker, tombstones
from .structure import CompressedCheckpointError


def torchao_module(name: str = "torchao") -> ModuleType:
    """The torchao module ``name``, or an ImportError naming the package to install (only a checkpoint with
    torchao-quantized Linear weights needs it)."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(
            f"this checkpoint's Linear weights are quantized with torchao (config.json: quantization_config"
            f"[{LINEARS_KEY!r}]), which is not installed here ({error}): pip install torchao"
        ) from error


def linears_config(quantization_config) -> dict | None:
    """The torchao config nested in a compressed checkpoint's marker, or None where its Linears are not quantized."""
    if isinstance(quantization_config, QuantizationConfigMixin):
        quantization_config = quantization_config.to_dict()
    if not isinstance(quantization_config, dict) or quantization_config.get("quant_method") != QUANT_METHOD:
        return None
    return quantization_config.get(LINEARS_KEY)


def stacked_marker(linears: QuantizationConfigMixin) -> dict:
    """The ``quantization_config`` of a compressed model whose Linears ``linears`` (a ``TorchAoConfig``, or a 4-bit
    ``BitsAndBytesConfig``: ``bnb_linears.py``) quantizes (JSON-able)."""
    nested = linears.to_dict()
    nested["quant_method"] = str(getattr(nested["quant_method"], "value", nested["quant_method"]))
    return quantization_marker(nested)


class TorchAoLinears(TorchAoHfQuantizer):
    """transformers' torchao quantizer for the Linear weights of a compressed model; saving also writes the
    tombstones (``modeling_tensorcompress``), which transformers would otherwise drop: with a quantizer attached,
    ``save_pretrained`` saves the state dict the quantizer gives."""

    def get_state_dict_and_metadata(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        flatten_tensor_state_dict = torchao_module(
            "torchao.prototype.safetensors.safetensors_support"
        ).flatten_tensor_state_dict
        marks = tombstones(model.config.compression_config["modules"])
        signpost = {SIGNPOST_KEY: marks.pop(SIGNPOST_KEY)}  # no module path: torchao's metadata names "module.tensor"
        flat, metadata = flatten_tensor_state_dict({**model.state_dict(), **marks})
        return {**flat, **signpost}, metadata


#: ``from_pretrained`` arguments that say where a config is read from.
_CONFIG_SOURCE = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def before_torchao_loading(cls: type, pretrained, kwargs: dict) -> dict | None:
    """Where the library's quantizer is not registered with transformers (the library is not installed), a checkpoint
    with quantized Linears loads through transformers' torchao quantizer: ``kwargs["config"]`` becomes a copy of the
    checkpoint's config whose ``quantization_config`` is the nested torchao config. Returns the marker to put back
    after loading (``after_torchao_loading``), or None where there is nothing to do."""
    if QUANT_METHOD in AUTO_QUANTIZER_MAPPING:
        return None
    config = kwargs.get("config")
    if not isinstance(config, PretrainedConfig):
        source = {key: kwargs[key] for key in _CONFIG_SOURCE if key in kwargs}
        config = cls.config_class.from_pretrained(config if config is not None else pretrained, **source)
    marker = getattr(config, "quantization_config", None)
    linears = linears_config(marker)
    if linears is None:
        return None
    # transformers' quantizers fail with a bare ModuleNotFoundError, or name no package, without it
    bitsandbytes_module() if is_bnb(linears) else torchao_module()
    config = copy.deepcopy(config)
    config.quantization_config = linears
    kwargs["config"] = config
    return marker


def after_torchao_loading(model: nn.Module, marker: dict) -> None:
    """The model loaded by ``before_torchao_loading``'s torchao (or bitsandbytes) quantizer gets the checkpoint's
    marker back, and a ``TorchAoLinears`` (``BnbLinears``) that saves it as the same checkpoint (tombstones
    included)."""
    linears = TorchAoLinears if isinstance(model.hf_quantizer.quantization_config, TorchAoConfig) else BnbLinears
    model.hf_quantizer = linears(model.hf_quantizer.quantization_config, pre_quantized=True)
    model.config.quantization_config = marker
    keep_saveable(model)


def linear_quantizer(linears: dict, **environment) -> TorchAoLinears | BnbLinears:
    """The quantizer of a checkpoint's Linear weights from its nested config, its environment checked
    (``environment``: ``validate_environment``'s arguments, e.g. ``device_map``)."""
    if is_bnb(linears):
        return bnb_quantizer(linears, **environment)
    if linears.get("quant_method") != "torchao":
        raise CompressedCheckpointError(
            f"config.json: quantization_config[{LINEARS_KEY!r}] has quant_method {linears.get('quant_method')!r}; "
            "the Linear weights beside compressed layers are quantized with torchao (quant_method 'torchao') or "
            "bitsandbytes 4-bit ('bitsandbytes'): "
            "restore config.json from the saved checkpoint"
        )
    torchao_module()  # the flattened Linear weights need torchao's tensor classes
    quantizer = TorchAoLinears(TorchAoConfig.from_dict(linears), pre_quantized=True)
    quantizer.validate_environment(**environment)
    return quantizer


def dense_linears(model: nn.Module) -> None:
    """Every torchao-quantized weight of ``model`` becomes the float tensor it stands for (torchao's
    ``dequantize()``; bitsandbytes 4-bit ones: ``bnb_linears.dense_bnb_linears``), in place: the Linear half of
    going back to a dense model."""
    linears = linears_config(getattr(model.config, "quantization_config", None))
    if linears is None:
        return
    if is_bnb(linears):
        dense_bnb_linears(model, linears)
        return
    base_tensor = torchao_module("torchao.utils").TorchAOBaseTensor
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if isinstance(parameter, base_tensor):
                module._parameters[name] = nn.Parameter(parameter.dequantize())


def keep_saveable(model: nn.Module) -> None:
    """After loading: drop the torchao (bitsandbytes) deserialisation steps transformers keeps in ``model._weight_conversions``.
    ``save_pretrained`` reverses every kept step and that one has no reverse (transformers 5.24 fails re-saving any
    loaded torchao checkpoint with ``NotImplementedError``); the quantizer's ``get_state_dict_and_metadata`` already
    writes the flattened form they read."""
    from transformers.integrations.bitsandbytes import Bnb4bitDeserialize
    from transformers.integrations.torchao import TorchAoDeserialize

    steps = (TorchAoDeserialize, Bnb4bitDeserialize)  # bitsandbytes': the same, and Linear4bit saves its own parts
    conversions = getattr(model, "_weight_conversions", None)
    if conversions:
        model._weight_conversions = [
            conversion
            for conversion in conversions
            if not any(isinstance(op, steps) for op in getattr(conversion, "operations", ()))
        ]
