"""Load-time checks of a compressed checkpoint, each failure naming the file and the key to fix: tensor shapes
against the specs in ``config.json`` (before transformers' generic size-mismatch message), and compressed tensors
that must be finite once loaded.

Ships inside saved checkpoints: torch, safetensors (a transformers dependency) and sibling files only.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

from .structure import CompressedCheckpointError, build_layer

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def stored_shapes(folder: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{key: (file name, shape)}`` of a local checkpoint's safetensors files, read from their headers only;
    empty for a folder without them (e.g. a Hub id)."""
    from safetensors import safe_open

    folder = str(folder)
    index = os.path.join(folder, WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            names = sorted(set(json.load(handle).get("weight_map", {}).values()))
    elif os.path.isfile(os.path.join(folder, WEIGHTS_NAME)):
        names = [WEIGHTS_NAME]
    else:
        return {}
    shapes = {}
    for name in names:
        with safe_open(os.path.join(folder, name), framework="pt") as handle:
            for key in handle.keys():
                shapes[key] = (name, tuple(handle.get_slice(key).get_shape()))
    return shapes


def file_of(stored: dict[str, tuple[str, tuple[int, ...]]], key: str) -> str:
    """The file holding ``key`` (or a key that differs only by the base model prefix), else the usual file name."""
    for name, (file, _) in stored.items():
        if name == key or name.endswith("." + key) or key.endswith("." + name):
            return file
    return WEIGHTS_NAME


def shape_mismatches(folder: str | os.PathLike, compression: dict) -> list[str]:
    """One line per compressed tensor whose stored shape differs from what its spec in ``config.json`` builds."""
    stored = stored_shapes(folder)
    problems = []
    modules = compression.get("modules")
    for name, spec in (modules if isinstance(modules, dict) else {}).items():
        with torch.device("meta"):
            expected = build_layer(spec).state_dict()
        for key, tensor in expected.items():
            file, shape = stored.get(f"{name}.{key}", (None, None))
            if shape is not None and shape != tuple(tensor.shape):
                problems.append(
                    f"{file}: {name}.{key} has shape {list(shape)}, but config.json compression_config['modules']"
                    f"[{name!r}] describes {list(tensor.shape)}"
                )
    return problems


def saved_compression(folder: str | os.PathLike) -> dict:
    """``compression_config`` as a local checkpoint's ``config.json`` holds it (module names as the file's keys
    spell them), or ``{}`` where there is no such file."""
    path = os.path.join(str(folder), "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        compression = json.load(handle).get("compression_config")
    return compression if isinstance(compression, dict) else {}


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


def check_finite(model: nn.Module, folder: str | os.PathLike | None = None) -> None:
    """Every floating tensor of every compressed layer is finite: a NaN in a factor or core would otherwise load
    without a word and poison every output."""
    compression = model.config.compression_config
    stored = stored_shapes(folder) if folder is not None and os.path.isdir(str(folder)) else {}
    for name in compression.get("modules", {}):
        for key, tensor in model.get_submodule(name).state_dict().items():
            if tensor.is_floating_point() and not tensor.is_meta and not torch.isfinite(tensor).all():
                full = f"{name}.{key}"
                raise CompressedCheckpointError(
                    f"{file_of(stored, full)}: tensor {full!r} holds NaN or infinite values, so every output would "
                    "be NaN; the file is corrupt or was saved from a diverged model: save the compressed model again "
                    "from a good state."
                )
