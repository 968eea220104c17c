"""Load-time checks of a compressed checkpoint, each failure a ``CompressedCheckpointError`` naming the file and the
key to fix. A checkpoint is executable input: the fused kernels read buffers by their sizes and indices select rows,
so everything the library reads is checked before it is used, by this one implementation on the native path (the
quantizer) and the ``trust_remote_code`` path (``Compressed<Base>.from_pretrained``) alike:

- from the safetensors headers (``checkpoint_files.py`` reads them, the shard index checked), before the weights
  load (``check_before_loading``; again after, for a Hub repo
  whose weights were not on disk yet): shapes against the specs in ``config.json``, each compressed module's keys
  (none missing or extra) and dtypes, a spec for every tombstone, the torchao-quantized Linears complete, in their
  dtypes and block shapes, and read with their ``linears`` config; the bitsandbytes 4-bit Linears likewise
  (``bnb_linears.check_bnb_file``: every part their packed quant state describes, in its dtype and shape);
- in memory, after (``check_loaded``): every compressed tensor's dtype, shape and finiteness, each submodule's
  ``check_state`` (value ranges: slot maps, indices, masks, padding), the tied output layer against the file, and,
  for a model of the class that was saved, every tensor loaded from the file (torchao parts and bitsandbytes quant
  states finite).

Ships inside saved checkpoints: torch, safetensors (a transformers dependency) and sibling files only.
"""

from __future__ import annotations

import json
import os
import re
from typing import NamedTuple

import torch
from torch import nn

from .checkpoint_files import (
    WEIGHTS_NAME,
    StoredTensor,
    file_of,
    saved_compression,
    saved_config,
    stored_metadata,
    stored_tensors,
)
from .contract import TOMBSTONE_KEY, TensorProblem
from .optional import sibling
from .structure import CompressedCheckpointError, build_recorded

SAVE_AGAIN = "save the compressed model again with save_pretrained (or restore the file from the saved checkpoint)"


def shape_mismatches(folder: str | os.PathLike, compression: dict) -> list[str]:
    """One line per compressed tensor whose stored shape differs from what its spec in ``config.json`` builds."""
    stored = stored_tensors(folder)
    problems = []
    modules = compression.get("modules")
    for name, spec in (modules if isinstance(modules, dict) else {}).items():
        with torch.device("meta"):
            expected = build_recorded(name, spec).state_dict()
        for key, tensor in expected.items():
            found = stored.get(f"{name}.{key}")
            if found is not None and found.shape != tuple(tensor.shape):
                problems.append(
                    f"{found.file}: {name}.{key} has shape {list(found.shape)}, but config.json "
                    f"compression_config['modules'][{name!r}] describes {list(tensor.shape)}"
                )
    return problems


def check_shapes(folder: str | os.PathLike) -> None:
    """Raise ``CompressedCheckpointError`` naming every tensor of a local checkpoint whose shape the spec recorded
    in its ``config.json`` contradicts (nothing to check for a folder that is not local)."""
    problems = shape_mismatches(folder, saved_compression(folder))
    if problems:
        raise CompressedCheckpointError(
            "The checkpoint's tensors do not have the shapes its compression_config (config.json) describes: "
            + "; ".join(problems[:4])
            + ". A per-module spec (rank, shape) was edited, or config.json belongs to other weights: restore "
            "config.json from the saved checkpoint or save the compressed model again with save_pretrained."
        )


class TorchAoWeight(NamedTuple):
    """A torchao-quantized weight as a checkpoint's safetensors metadata describes it."""

    parts: dict[str, str]  # part name (qdata, scale, …) -> the key torchao flattened it to
    block_size: list[int] | None
    kind: str  # torchao's tensor class, e.g. IntxUnpackedToInt8Tensor
    dtype: str | None  # the dtype it dequantizes to


#: Dtypes of the parts of the torchao tensor classes ``quantize_linears`` is used with (``scale``: the weight's dtype,
#: unless the config sets ``scale_dtype``); transformers' torchao loader fails on others without naming the tensor.
TORCHAO_PART_DTYPES = {"IntxUnpackedToInt8Tensor": {"qdata": torch.int8, "zero_point": torch.int8}}


def torchao_weights(metadata: dict[str, str]) -> dict[str, TorchAoWeight]:
    """``{Linear weight key: TorchAoWeight}`` from a checkpoint's safetensors metadata (torchao writes
    ``<module>._<name>_<part>`` for each of a quantized tensor's ``_tensor_data_names``)."""
    weights = {}
    for key, value in metadata.items():
        try:
            described = json.loads(value)
        except (TypeError, ValueError):
            continue
        names = described.get("_tensor_data_names") if isinstance(described, dict) else None
        if names:
            module, _, name = key.rpartition(".")
            data = described.get("_data") or {}
            dtype = (data.get("dtype") or {}).get("_data") if isinstance(data.get("dtype"), dict) else None
            parts = {part: f"{module}._{name}_{part}" for part in names}
            weights[key] = TorchAoWeight(parts, data.get("block_size"), str(described.get("_type")), dtype)
    return weights


def _torchao_scale_dtype(linears: object, described: TorchAoWeight) -> torch.dtype | None:
    """The dtype a weight's ``scale`` is stored in: the config's ``scale_dtype``, else the weight's own dtype."""
    try:
        chosen = linears["quant_type"]["default"]["_data"].get("scale_dtype")
    except (KeyError, TypeError, AttributeError):
        chosen = None
    name = chosen.get("_data") if isinstance(chosen, dict) else described.dtype
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) else None


def _check_torchao(stored: dict[str, StoredTensor], weights: dict[str, TorchAoWeight], linears: object) -> None:
    """Every flattened part of each torchao weight present, in its dtype, the scale-like parts one entry per
    block of ``qdata`` (transformers' torchao loader fails on anything else without naming the tensor, or rounds a
    scale), and a ``linears`` entry in ``quantization_config`` saying how to read them (without it transformers
    leaves those Linears random)."""
    for weight, described in weights.items():
        keys = list(described.parts.values())
        missing = [key for key in keys if key not in stored]
        if missing:
            raise CompressedCheckpointError(
                f"{WEIGHTS_NAME}: the torchao-quantized weight {weight!r} lacks {missing} (of {keys}), so it cannot "
                f"be rebuilt; {SAVE_AGAIN}"
            )
        dtypes = dict(TORCHAO_PART_DTYPES.get(described.kind, {}))
        if described.kind in TORCHAO_PART_DTYPES:
            dtypes["scale"] = _torchao_scale_dtype(linears, described)
        for part, dtype in dtypes.items():
            key = described.parts.get(part)
            if key is not None and dtype is not None and stored[key].dtype != dtype:
                raise _problem(stored, key, f"is stored as {stored[key].dtype}, where {described.kind} stores {dtype}")
        qdata, block = described.parts.get("qdata"), described.block_size
        if qdata is None or not isinstance(block, list):
            continue
        if len(block) != len(stored[qdata].shape):
            raise _problem(
                stored,
                qdata,
                f"has shape {list(stored[qdata].shape)}, where blocks {block} need one of rank {len(block)}",
            )
        blocks = [size // step if step else -1 for size, step in zip(stored[qdata].shape, block)]
        for part, key in described.parts.items():
            if part != "qdata" and list(stored[key].shape) != blocks:
                raise _problem(
                    stored,
                    key,
                    f"has shape {list(stored[key].shape)}, where {qdata!r} {list(stored[qdata].shape)} "
                    f"in blocks of {block} needs {blocks}",
                )
    flattened = sorted(key for described in weights.values() for key in described.parts.values())
    if flattened and linears is None:
        raise CompressedCheckpointError(
            f"{stored[flattened[0]].file}: {flattened[0]!r} is part of a torchao-quantized Linear weight, but "
            "config.json's quantization_config has no 'linears' entry saying how to read it (the Linears would load "
            f"at random); restore config.json from the saved checkpoint, or {SAVE_AGAIN}"
        )


def _check_tombstones(stored: dict[str, StoredTensor], compression: dict) -> None:
    """Each tombstone (a uint8 scalar under a replaced module's dense key) has a spec: without one the module would
    be built dense and read that scalar as its weight."""
    modules = compression.get("modules")
    if not isinstance(modules, dict):
        return  # compression_of names that problem
    for key, found in stored.items():
        name = key.removesuffix("." + TOMBSTONE_KEY)
        if name != key and found.dtype == torch.uint8 and found.shape == () and name not in modules:
            raise CompressedCheckpointError(
                f"{found.file}: {key!r} marks {name!r} as a compressed module, but config.json's "
                f"compression_config['modules'] has no spec for it; restore config.json from the saved checkpoint, "
                f"or {SAVE_AGAIN}"
            )


def check_before_loading(folder: str | os.PathLike | None) -> None:
    """What can be checked from a local checkpoint's headers before any weight is read: the shapes its specs
    describe, a spec for every replaced module, each compressed module's tensors (``_check_layer_file``), and the
    torchao-quantized Linears (``_check_torchao``)."""
    stored = stored_tensors(folder)
    if not stored:  # not local, or a Hub repo whose weights are not downloaded yet (check_loaded runs this again)
        return
    check_shapes(folder)
    config = saved_config(folder)
    compression = config.get("compression_config")
    compression = compression if isinstance(compression, dict) else {}
    _check_tombstones(stored, compression)
    saved_dtype = config.get("dtype", config.get("torch_dtype"))
    dtype = getattr(torch, saved_dtype, None) if isinstance(saved_dtype, str) else None
    modules = compression.get("modules")
    for name, spec in (modules if isinstance(modules, dict) else {}).items():
        _check_layer_file(name, spec, stored, dtype if isinstance(dtype, torch.dtype) else None)
    marker = config.get("quantization_config")
    linears = marker.get("linears") if isinstance(marker, dict) else None
    _check_torchao(stored, torchao_weights(stored_metadata(folder)), linears)
    bnb = sibling("bnb_linears")  # carried by checkpoints with quantized Linears only
    if bnb is not None:
        bnb.check_bnb_file(str(folder), stored, linears)


def _problem(stored: dict[str, StoredTensor], key: str, problem: str) -> CompressedCheckpointError:
    """The error for tensor ``key``: its file, the key, what is wrong, and the fix."""
    return CompressedCheckpointError(f"{file_of(stored, key)}: tensor {key!r} {problem}; {SAVE_AGAIN}")


def _file_prefix(stored: dict[str, StoredTensor], name: str, model: nn.Module) -> str:
    """How the file spells module ``name``: as the model does, or with/without the base model prefix (a head
    class's checkpoint loaded into the base class, or the other way round)."""
    base = getattr(model, "base_model_prefix", "")
    candidates = [name, f"{base}.{name}"] + ([name[len(base) + 1 :]] if name.startswith(base + ".") else [])
    for candidate in candidates:
        if any(key.startswith(candidate + ".") for key in stored):
            return candidate
    return name


def _check_finite_layer(stored: dict[str, StoredTensor], name: str, tensors: dict[str, torch.Tensor]) -> None:
    """Every floating tensor of module ``name`` is finite: one NaN would poison every output without a word."""
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not tensor.is_meta and not torch.isfinite(tensor).all():
            full = f"{name}.{key}"
            raise CompressedCheckpointError(
                f"{file_of(stored, full)}: tensor {full!r} holds NaN or infinite values, so every output would be "
                "NaN; the file is corrupt or was saved from a diverged model: save the compressed model again from "
                "a good state."
            )


def _fixed_dtype(layer: nn.Module, key: str, expected: torch.Tensor) -> bool:
    """Whether a tensor must be stored in exactly its layer's dtype: integers, and the buffers of stored matrices
    (their dtypes are the format); float parameters follow the model's dtype."""
    owner = layer.get_submodule(key.rpartition(".")[0]) if "." in key else layer
    return not expected.is_floating_point() or getattr(owner, "keeps_dtypes", False)


def _check_layer_file(name: str, spec: dict, stored: dict[str, StoredTensor], dtype: torch.dtype | None) -> None:
    """Before loading, module ``name`` (as the file spells it) against an empty layer built from its spec: no
    tensor missing or extra in the file, each in the dtype the layer stores (float parameters: the model's dtype
    that config.json records). Transformers would load another dtype into the buffer as it is, or round it."""
    with torch.device("meta"):
        layer = build_recorded(name, spec)
    reference, parameters = layer.state_dict(), dict(layer.named_parameters())
    in_file = {key[len(name) + 1 :] for key in stored if key.startswith(name + ".")} - {TOMBSTONE_KEY}
    extra, missing = sorted(in_file - reference.keys()), sorted(reference.keys() - in_file)
    if extra or missing:
        key = f"{name}.{(extra or missing)[0]}"
        raise CompressedCheckpointError(
            f"{file_of(stored, key)}: the tensors of {name!r} do not match its spec in config.json "
            f"(compression_config['modules']): {'extra' if extra else 'missing'} {key!r}"
            + (f" (and {len(extra) + len(missing) - 1} more)" if len(extra) + len(missing) > 1 else "")
            + ". A spec field (bits, rank, tiers) was edited or a tensor added or removed: restore config.json "
            f"from the saved checkpoint, or {SAVE_AGAIN}"
        )
    for key, expected in reference.items():
        full, found = f"{name}.{key}", stored[f"{name}.{key}"]
        if _fixed_dtype(layer, key, expected):
            wanted = expected.dtype
        elif key in parameters and dtype is not None:
            wanted = dtype
        else:
            wanted = found.dtype if isinstance(found.dtype, torch.dtype) and found.dtype.is_floating_point else None
        if found.dtype != wanted:
            raise _problem(stored, full, f"is stored as {found.dtype}, where this layer stores {wanted or 'floats'}")


def _check_layer(model: nn.Module, name: str, spec: dict, stored: dict[str, StoredTensor]) -> None:
    """After loading, module ``name`` in memory: dtypes and shapes against an empty layer built from its spec
    (what the kernels and indices will read), finiteness, and each submodule's own ``check_state``."""
    layer = model.get_submodule(name)
    with torch.device("meta"):
        reference = build_recorded(name, spec).state_dict()
    loaded = layer.state_dict()
    for key, expected in reference.items():
        full, tensor = f"{name}.{key}", loaded.get(key)
        if tensor is None:
            raise _problem(stored, full, "is not in the loaded model")
        if _fixed_dtype(layer, key, expected) and tensor.dtype != expected.dtype:
            raise _problem(stored, full, f"is {tensor.dtype}, where this layer stores {expected.dtype}")
        if not tensor.is_floating_point() and expected.is_floating_point():
            raise _problem(stored, full, f"is {tensor.dtype}, where this layer holds floats")
        if tuple(tensor.shape) != tuple(expected.shape):
            raise _problem(
                stored, full, f"has shape {list(tensor.shape)}, where its spec builds {list(expected.shape)}"
            )
    _check_finite_layer(stored, name, loaded)
    for sub, module in layer.named_modules():
        if hasattr(module, "check_state"):
            try:
                module.check_state()
            except TensorProblem as problem:
                raise _problem(stored, ".".join(filter(None, (name, sub, problem.key))), problem.problem) from None


def _module_name(model: nn.Module, module: nn.Module | None) -> str | None:
    return next((name for name, candidate in model.named_modules() if candidate is module), None)


def _check_tied_output(model: nn.Module, name: str, stored: dict[str, StoredTensor]) -> None:
    """A layer serving the tied output layer (``tied_output``) and the file agree: a head the layer serves has no
    weight of its own in the file; an output layer it does not serve has one (else it would load at random)."""
    layer = model.get_submodule(name)
    if not hasattr(layer, "tied_output") or not stored:
        return
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = _module_name(model, output)
    if head is None:
        return
    key = f"{_file_prefix(stored, head, model)}.weight"
    serves = getattr(output, "embedding", None) is layer
    if serves and key in stored:
        raise CompressedCheckpointError(
            f"{stored[key].file}: the checkpoint holds an output layer of its own ({key!r}), but config.json's "
            f"compression_config['modules'][{name!r}]['tied_output'] = {layer.tied_output!r} makes {name!r} serve "
            f"it; restore config.json from the saved checkpoint, or {SAVE_AGAIN}"
        )
    if not serves and layer is model.get_input_embeddings() and key not in stored:
        raise CompressedCheckpointError(
            f"{WEIGHTS_NAME}: the checkpoint holds no weight for the output layer {head!r} ({key!r} is missing), and "
            f"config.json's compression_config['modules'][{name!r}]['tied_output'] = {layer.tied_output!r} does not "
            f"make {name!r} serve it: the head would be random; restore tied_output ({head!r}) in config.json, or "
            f"{SAVE_AGAIN}"
        )


def _saved_class(model: nn.Module, config: dict) -> bool:
    """Whether ``model`` is of the class the checkpoint was saved from (then every tensor must come from it)."""
    saved = {name.removeprefix("Compressed") for name in (config.get("architectures") or [])}
    return any(cls.__name__.removeprefix("Compressed") in saved for cls in type(model).__mro__[:3])


def _check_other_tensors(model: nn.Module, stored: dict[str, StoredTensor], config: dict) -> None:
    """Loaded into the class it was saved from, every tensor of the model came from the file (transformers flags
    each one it loads): a deleted key, or torchao Linears read without their config, would leave random weights.
    torchao-quantized weights: each part finite."""
    if _saved_class(model, config):
        optional = [re.compile(pattern) for pattern in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]
        bnb = sibling("bnb_linears")
        derived = bnb.quant_state_keys(model) if bnb is not None else set()
        unloaded = sorted(
            key
            for key, tensor in model.state_dict(keep_vars=True).items()
            if not getattr(tensor, "_is_hf_initialized", False)
            and not any(p.search(key) for p in optional)
            and key not in derived
        )
        if unloaded:
            raise CompressedCheckpointError(
                f"{file_of(stored, unloaded[0])}: the checkpoint does not hold {unloaded[:6]}, which "
                f"{type(model).__name__} loads from it (they would be random); {SAVE_AGAIN}"
            )
    for module_name, module in model.named_modules():
        for parameter_name, parameter in module.named_parameters(recurse=False):
            for part in getattr(parameter, "tensor_data_names", ()) or ():
                value = getattr(parameter, part, None)
                if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
                    key = f"{module_name}._{parameter_name}_{part}"
                    raise _problem(stored, key, "holds NaN or infinite values (a torchao-quantized Linear's part)")


def check_loaded(model: nn.Module, folder: str | os.PathLike | None = None) -> None:
    """After the weights load, on both load paths: every compressed module checked (``_check_layer``), the tied
    output layer, and the model's other tensors. ``folder``: the local checkpoint (its headers give the file's own
    dtypes and keys); without one, what is in memory is checked."""
    check_before_loading(folder)  # again: a Hub repo's weights are on disk only now
    stored, config = stored_tensors(folder), saved_config(folder)
    modules = model.config.compression_config.get("modules", {})
    for name, spec in modules.items():
        _check_layer(model, name, spec, stored)
    for name in modules:
        _check_tied_output(model, name, stored)
    _check_other_tensors(model, stored, config)
    bnb = sibling("bnb_linears")
    if bnb is not None:
        bnb.check_bnb_loaded(model)
