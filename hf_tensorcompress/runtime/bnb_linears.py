"""Compressed layers beside bitsandbytes 4-bit ``nn.Linear`` weights (NF4 / FP4, two codes a byte, on CPU too).

The same nesting as torchao's (``torchao_linears.py``): the library's marker records ``BitsAndBytesConfig.to_dict()``
under ``LINEARS_KEY``, and transformers' own ``Bnb4BitHfQuantizer`` does the bitsandbytes part both ways: loading,
it builds ``bnb.nn.Linear4bit`` modules and rebuilds each ``Params4bit`` from its packed codes and quant state
(``weight``, ``weight.absmax``, ``weight.quant_map``, nested statistics and the packed ``quant_state`` JSON);
saving, ``Linear4bit`` writes those parts itself and ``BnbLinears`` adds the tombstones. ``packed_linear`` quantizes
one float Linear the way that quantizer does while loading a float checkpoint.

Ships inside saved checkpoints: torch and transformers; bitsandbytes only where a checkpoint has 4-bit Linears,
and then through ``bitsandbytes_module`` alone (transformers refuses a Hub checkpoint's remote code while any import
statement outside a ``try`` block names a package that is not installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
from types import ModuleType

import torch
from torch import nn
from transformers import BitsAndBytesConfig
from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

from .contract import LINEARS_KEY, tombstones
from .structure import CompressedCheckpointError

BNB_METHOD = "bitsandbytes"
#: The keys ``Params4bit`` adds beside a Linear's ``weight`` (``QuantState.as_dict(packed=True)``).
QUANT_STATE_PREFIX = "weight.quant_state.bitsandbytes__"
SAVE_AGAIN = "save the compressed model again with save_pretrained (or restore the file from the saved checkpoint)"


#: What 4-bit Linears need besides torch and transformers (transformers' bitsandbytes quantizer requires
#: accelerate too): a missing one is named with the others, not after the first is installed.
PACKAGES = ("bitsandbytes", "accelerate")


def bitsandbytes_module(name: str = "bitsandbytes") -> ModuleType:
    """The bitsandbytes module ``name``, or one ImportError naming every package of ``PACKAGES`` to install (only a
    checkpoint with bitsandbytes 4-bit Linear weights needs them)."""
    missing = [package for package in PACKAGES if importlib.util.find_spec(package) is None]
    if not missing:
        try:
            return importlib.import_module(name)
        except ImportError as error:
            raise ImportError(_needs([PACKAGES[0]]) + f" ({error})") from error
    raise ImportError(_needs(missing))


def _needs(missing: list[str]) -> str:
    return (
        f"this checkpoint's Linear weights are 4-bit bitsandbytes weights (config.json: quantization_config"
        f"[{LINEARS_KEY!r}]), which need {' and '.join(missing)}, not installed here: pip install {' '.join(missing)}"
    )


def is_bnb(linears: dict | None) -> bool:
    """Whether a nested ``linears`` config is bitsandbytes'."""
    return isinstance(linears, dict) and linears.get("quant_method") == BNB_METHOD


class BnbLinears(Bnb4BitHfQuantizer):
    """transformers' bitsandbytes 4-bit quantizer for the Linear weights of a compressed model; saving also writes
    the tombstones (``modeling_tensorcompress``), which transformers would otherwise drop: with a quantizer
    attached, ``save_pretrained`` saves the state dict the quantizer gives."""

    def validate_environment(self, *args, **kwargs) -> None:
        bitsandbytes_module()  # transformers' own check says "requires bitsandbytes" without the package to install
        super().validate_environment(*args, **kwargs)

    def get_state_dict_and_metadata(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        return {**model.state_dict(), **tombstones(model.config.compression_config["modules"])}, {}


def bnb_quantizer(linears: dict, **environment) -> BnbLinears:
    """The quantizer of a checkpoint's 4-bit Linear weights from its nested config, its environment checked."""
    bitsandbytes_module()
    config = BitsAndBytesConfig.from_dict(dict(linears))
    if not config.load_in_4bit:
        raise CompressedCheckpointError(
            f"config.json: quantization_config[{LINEARS_KEY!r}] is a bitsandbytes config without load_in_4bit; the "
            "Linear weights beside compressed layers are stored 4-bit: restore config.json from the saved checkpoint"
        )
    quantizer = BnbLinears(config, pre_quantized=True)
    quantizer.validate_environment(**environment)
    return quantizer


def packed_linear(linear: nn.Linear, config: BitsAndBytesConfig) -> nn.Module:
    """``linear`` as the ``bnb.nn.Linear4bit`` transformers' bitsandbytes quantizer builds from it while loading a
    float checkpoint (``replace_with_bnb_linear``, then ``Params4bit(...).to(device)``, which packs the codes)."""
    bnb = bitsandbytes_module()
    packed = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        linear.bias is not None,
        config.bnb_4bit_compute_dtype,
        compress_statistics=config.bnb_4bit_use_double_quant,
        quant_type=config.bnb_4bit_quant_type,
        quant_storage=config.bnb_4bit_quant_storage,
        device="meta",
    )
    weight = linear.weight.detach()
    packed.weight = bnb.nn.Params4bit(
        weight,
        requires_grad=False,
        compress_statistics=config.bnb_4bit_use_double_quant,
        quant_type=config.bnb_4bit_quant_type,
        quant_storage=config.bnb_4bit_quant_storage,
        module=packed,
    ).to(weight.device)
    if linear.bias is not None:
        packed.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    packed.source_cls = type(linear)
    return packed


def dense_bnb_linears(model: nn.Module, linears: dict) -> None:
    """Every 4-bit Linear of ``model`` becomes the float ``nn.Linear`` it stands for (transformers'
    ``dequantize_and_replace``), in the dtype of the model's float parameters."""
    from transformers.integrations.bitsandbytes import dequantize_and_replace

    bitsandbytes_module()
    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    dequantize_and_replace(model, BitsAndBytesConfig.from_dict(dict(linears)), dtype=floats[0] if floats else None)


def _packed_state(folder: str, file: str, key: str) -> dict:
    """The JSON a ``...quant_state.bitsandbytes__<type>`` tensor packs (shape, blocksize, dtype, nesting)."""
    import os

    from safetensors import safe_open

    with safe_open(os.path.join(folder, file), framework="pt") as handle:
        raw = handle.get_tensor(key)
    try:
        state = json.loads(bytes(raw.tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        state = None
    if not isinstance(state, dict):
        raise CompressedCheckpointError(f"{file}: tensor {key!r} is not a bitsandbytes quant state; {SAVE_AGAIN}")
    return state


def bnb_parts(state: dict, weight: str, storage: torch.dtype) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` of every part a 4-bit ``weight`` of this packed ``state`` stores, its codes packed
    two a byte into ``storage`` elements."""
    shape = state.get("shape")
    blocksize = state.get("blocksize")
    if not (isinstance(shape, list) and all(isinstance(n, int) and n > 0 for n in shape)):
        raise ValueError(f"its quant state's shape {shape!r} is not a list of sizes")
    if not (isinstance(blocksize, int) and blocksize > 0):
        raise ValueError(f"its quant state's blocksize {blocksize!r} is not a positive integer")
    values = 1
    for size in shape:
        values *= size
    blocks = math.ceil(values / blocksize)
    module = weight.removesuffix(".weight")
    packed = math.ceil(math.ceil(values / 2) / storage.itemsize)
    parts = {weight: (storage, (packed, 1)), f"{module}.weight.quant_map": (torch.float32, (16,))}
    if "nested_blocksize" in state:
        nested = state["nested_blocksize"]
        if not (isinstance(nested, int) and nested > 0):
            raise ValueError(f"its quant state's nested_blocksize {nested!r} is not a positive integer")
        parts[f"{module}.weight.absmax"] = (torch.uint8, (blocks,))
        parts[f"{module}.weight.nested_absmax"] = (torch.float32, (math.ceil(blocks / nested),))
        parts[f"{module}.weight.nested_quant_map"] = (torch.float32, (256,))
    else:
        parts[f"{module}.weight.absmax"] = (torch.float32, (blocks,))
    return parts


def check_bnb_file(folder: str | None, stored: dict, linears: object) -> None:
    """Before loading, from a local checkpoint's headers: every 4-bit Linear weight (one per packed quant state)
    has each part its quant state describes, in bitsandbytes' dtype and shape, and a ``linears`` entry in
    ``quantization_config`` saying how to read them (without it transformers would load the packed bytes as a
    float weight)."""
    states = sorted(key for key in stored if QUANT_STATE_PREFIX in key)
    if not states:
        return
    if not is_bnb(linears):
        raise CompressedCheckpointError(
            f"{stored[states[0]].file}: {states[0]!r} is part of a bitsandbytes 4-bit Linear weight, but config.json's "
            "quantization_config has no bitsandbytes 'linears' entry saying how to read it; restore config.json "
            f"from the saved checkpoint, or {SAVE_AGAIN}"
        )
    name = str(linears.get("bnb_4bit_quant_storage", "uint8")).removeprefix("torch.")
    storage = getattr(torch, name, None)
    if not isinstance(storage, torch.dtype):
        raise CompressedCheckpointError(
            f"config.json: quantization_config[{LINEARS_KEY!r}]['bnb_4bit_quant_storage'] = {name!r} is not a torch "
            "dtype; restore config.json from the saved checkpoint"
        )
    for key in states:
        weight = key.split(".quant_state.")[0]
        try:
            parts = bnb_parts(_packed_state(folder, stored[key].file, key), weight, storage)
        except ValueError as error:
            raise CompressedCheckpointError(f"{stored[key].file}: tensor {key!r}: {error}; {SAVE_AGAIN}") from None
        for part, (dtype, shape) in parts.items():
            found = stored.get(part)
            if found is None:
                raise CompressedCheckpointError(
                    f"{stored[key].file}: the 4-bit Linear weight {weight!r} lacks {part!r}, so it cannot be rebuilt; "
                    f"{SAVE_AGAIN}"
                )
            if found.dtype != dtype or tuple(found.shape) != shape:
                raise CompressedCheckpointError(
                    f"{found.file}: tensor {part!r} is {found.dtype} of shape {list(found.shape)}, where bitsandbytes "
                    f"stores {dtype} of shape {list(shape)} for {weight!r}; {SAVE_AGAIN}"
                )


def _quant_state(module: nn.Module):
    """The quant state of a 4-bit Linear's weight parameter, else None. Only a registered parameter is read: a
    compressed layer's ``weight`` property rebuilds its dense matrix (a tiered embedding of 262,144 rows: 671 MB)."""
    return getattr(module._parameters.get("weight"), "quant_state", None)


def quant_state_keys(model: nn.Module) -> set[str]:
    """The state-dict keys of ``model`` that 4-bit Linears derive from their weight's quant state (loaded with the
    weight, which is checked itself)."""
    keys = set()
    for name, module in model.named_modules():
        state = _quant_state(module)
        if state is not None and hasattr(state, "as_dict"):
            keys.update(f"{name}.weight.{part}" for part in state.as_dict(packed=True))
    return keys


def check_bnb_loaded(model: nn.Module) -> None:
    """After loading: every 4-bit Linear's float quant-state tensors finite (one NaN scale poisons every output)."""
    for name, module in model.named_modules():
        state = _quant_state(module)
        if state is None or not hasattr(state, "as_dict"):
            continue
        for part, tensor in state.as_dict(packed=True).items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise CompressedCheckpointError(
                    f"tensor '{name}.weight.{part}' holds NaN or infinite values (a 4-bit Linear's quant state); "
                    f"{SAVE_AGAIN}"
                )
