"""The rest of the model quantized too: torchao, or bitsandbytes 4-bit, for the ``nn.Linear`` weights beside
compressed layers.

``quantize_linears(model, TorchAoConfig(...))`` quantizes the Linear weights of a compressed model with torchao, as
``from_pretrained(dense, quantization_config=TorchAoConfig(...))`` would have (transformers' torchao quantizer picks
the Linears, torchao's ``quantize_`` quantizes them). The model then carries the library's quantizer with torchao's
nested in it (``runtime/torchao_linears.py``), so ``save_pretrained`` writes one checkpoint whose ``config.json``
records both configs, and ``from_pretrained(folder)`` loads it back (``trust_remote_code=True`` too, where torchao is
installed). The other order, a model loaded with ``TorchAoConfig`` and then compressed, reaches the same state
(``apply_compression`` calls ``adopted_torchao`` and ``attach``).

``quantize_linears(model, BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"))`` does the same with
bitsandbytes' packed 4-bit ``Linear4bit`` (two codes a byte on CPU too; ``runtime/bnb_linears.py``): the Linears
transformers' bitsandbytes quantizer would replace, each packed as that quantizer packs it while loading.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import BitsAndBytesConfig, TorchAoConfig
from transformers.quantizers.auto import AutoHfQuantizer

from .core.extras import require
from .runtime.bnb_linears import packed_linear
from .runtime.contract import QUANT_METHOD
from .runtime.modeling_tensorcompress import is_compressed
from .runtime.torchao_linears import linear_quantizer, linears_config, stacked_marker


def check_torchao_config(config: object) -> TorchAoConfig | BitsAndBytesConfig:
    """``config`` as ``quantize_linears`` takes it: one ``TorchAoConfig`` of one torchao config for every Linear,
    or a 4-bit ``BitsAndBytesConfig``."""
    if isinstance(config, BitsAndBytesConfig):
        if not config.load_in_4bit:
            raise ValueError(
                "quantize_linears packs Linears with bitsandbytes 4-bit only: BitsAndBytesConfig(load_in_4bit=True, "
                "bnb_4bit_quant_type='nf4'); for 8 bits use TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8))"
            )
        require("bitsandbytes", "packing the Linear weights with bitsandbytes")
        return config
    if not isinstance(config, TorchAoConfig):
        raise TypeError(
            f"quantize_linears takes a transformers TorchAoConfig or a 4-bit BitsAndBytesConfig, got "
            f"{type(config).__name__}; wrap the torchao config: "
            "TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))"
        )
    quantization = require("torchao.quantization", "quantizing the Linear weights with torchao")
    if isinstance(config.quant_type, quantization.FqnToConfig):
        raise ValueError(
            "quantize_linears applies one torchao config to every Linear; FqnToConfig (per-module configs) is not "
            "supported: pass one config, and TorchAoConfig(..., modules_to_not_convert=[...]) for Linears to keep"
        )
    return config


def attach(model: nn.Module, config: TorchAoConfig | BitsAndBytesConfig) -> None:
    """Make ``model`` (compressed, its Linears quantized with ``config``) a quantized transformers model whose
    quantizer is the library's with torchao's nested: it saves the Linears as torchao does, the rest as ours."""
    marker = stacked_marker(config)
    quantizer = AutoHfQuantizer.from_config(marker, pre_quantized=True)  # the registered TensorCompressQuantizer
    quantizer.validate_environment()  # builds its torchao (bitsandbytes) quantizer of the Linears
    model.hf_quantizer = quantizer
    model.is_quantized = True
    model.quantization_method = QUANT_METHOD
    model.config.quantization_config = marker


def quantize_linears(model: nn.Module, config: TorchAoConfig | BitsAndBytesConfig) -> nn.Module:
    """Quantize, with torchao (``TorchAoConfig``) or bitsandbytes 4-bit (``BitsAndBytesConfig(load_in_4bit=True)``),
    the ``nn.Linear`` weights of compressed ``model`` that transformers' quantizer of that library would quantize
    (not the compressed layers, nor a tied or last output layer unless ``config`` says so), in place; returns the
    model. Every Linear is quantized on a copy before any is installed, so an error leaves the model as it was."""
    config = check_torchao_config(config)
    if not is_compressed(model):
        raise ValueError(
            f"{type(model).__name__} is not compressed: quantize_linears quantizes the Linears beside compressed "
            "layers. Compress it first (apply_compression), or quantize a dense model with transformers: "
            "from_pretrained(path, quantization_config=TorchAoConfig(...))"
        )
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError(
            f"{type(model).__name__}'s Linears are quantized already ({linears_config(model.config.quantization_config)}"
            "); quantize the compressed model once, from its float Linears"
        )
    names = _bnb_targets(model, config) if isinstance(config, BitsAndBytesConfig) else _torchao_targets(model, config)
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.Linear weight to quantize beside its compressed layers")
    copies = nn.ModuleDict({str(index): _copy(model.get_submodule(name)) for index, name in enumerate(names)})
    if isinstance(config, BitsAndBytesConfig):
        # a new module is built in training mode: it keeps the replaced one's (bitsandbytes' eval path is another)
        copies = nn.ModuleDict(
            {index: packed_linear(linear, config).train(linear.training) for index, linear in copies.items()}
        )
    else:
        from torchao.quantization import quantize_  # check_torchao_config made sure it is installed

        quantize_(copies, config.get_apply_tensor_subclass(), filter_fn=lambda module, fqn: fqn in copies)
    for index, name in enumerate(names):
        model.set_submodule(name, copies[str(index)])
    attach(model, config)
    return model


def _torchao_targets(model: nn.Module, config: TorchAoConfig) -> list[str]:
    """The Linears transformers' torchao quantizer would quantize in ``model``."""
    selector = linear_quantizer(stacked_marker(config)["linears"])
    selector._process_model_before_weight_loading(model)  # transformers' choice of modules to leave float
    return [
        name.removesuffix(".weight")
        for name, _ in model.named_parameters()
        if selector.param_needs_quantization(model, name)
    ]


def _bnb_targets(model: nn.Module, config: BitsAndBytesConfig) -> list[str]:
    """The Linears transformers' bitsandbytes quantizer would replace in ``model`` (``replace_with_bnb_linear``:
    plain ``nn.Linear`` modules outside its modules to leave float, which a compressed layer never is)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    selector = linear_quantizer(stacked_marker(config)["linears"])
    skip = selector.get_modules_to_not_convert(model, config.llm_int8_skip_modules, model._keep_in_fp32_modules)
    return [
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear and should_convert_module(name, skip)
    ]


def _copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that shares its tensors but not its parameter table: quantizing it leaves ``module``."""
    duplicate = copy.copy(module)
    duplicate._parameters = dict(module._parameters)
    return duplicate


def is_dequantized_gguf(model: nn.Module) -> bool:
    """Whether ``model`` was loaded from a GGUF file (``from_pretrained(..., gguf_file=...)``) with its weights
    dequantized to plain float tensors (transformers does so for architectures its GGUF kernels do not cover, where no
    kernel is installed, or with ``GgufConfig(dequantize=True)``): only its quantizer says where they came from."""
    config = getattr(getattr(model, "hf_quantizer", None), "quantization_config", None)
    method = getattr(config, "quant_method", None)
    if str(getattr(method, "value", method)) != "gguf":
        return False
    return all(type(p.data) is torch.Tensor and p.is_floating_point() for p in model.parameters())


def release_gguf(model: nn.Module) -> None:
    """Drop the quantizer of a model loaded from a GGUF file (its weights are float already): transformers refuses
    to save a model that still carries it."""
    if is_dequantized_gguf(model):
        model.hf_quantizer.remove_quantization_config(model)


def adopted_torchao(model: nn.Module, targets: list[str]) -> TorchAoConfig | None:
    """Before compressing ``model``: the ``TorchAoConfig`` its Linears were quantized with while loading (``attach``
    records it beside the compression afterwards), or None. Other quantizers, and torchao-quantized targets,
    are refused: compressing replaces float weights, and one checkpoint carries one quantization_config."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or is_dequantized_gguf(model):
        return None
    config = quantizer.quantization_config
    if not isinstance(config, TorchAoConfig):
        method = getattr(config.quant_method, "value", config.quant_method)
        if str(method) == "gguf":
            raise ValueError(
                f"{type(model).__name__} holds GGUF-packed weights, and compressing needs float ones: load the file "
                "with hf_tensorcompress.load_model(path) or from_pretrained(..., gguf_file=..., "
                "quantization_config=GgufConfig(dequantize=True))"
            )
        raise ValueError(
            f"{type(model).__name__} is quantized with {method!r}; compressing it would drop that quantization. Load "
            "the float model, compress it, then quantize its Linears with quantize_linears(model, TorchAoConfig(...))"
        )
    from torchao.utils import TorchAOBaseTensor

    quantized = [
        name for name in targets if isinstance(getattr(model.get_submodule(name), "weight", None), TorchAOBaseTensor)
    ]
    if quantized:
        raise ValueError(
            f"{quantized[0]} is torchao-quantized (TorchAoConfig include_input_output_embeddings=True), so there is "
            "no float weight to compress; load with include_input_output_embeddings=False"
        )
    return config
