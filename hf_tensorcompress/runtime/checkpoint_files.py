"""What a local checkpoint's files hold, read without loading a tensor: the safetensors headers (keys, dtypes, shapes)
and metadata of its weight files (a shard index's names checked: inside the folder, regular files), its
``config.json``, and the local folder a Hub repo id was downloaded to. The loading checks (``checks.py``) and the
size accounting read them.

Ships inside saved checkpoints: the standard library, torch, safetensors (a transformers dependency) and sibling
files only.
"""

from __future__ import annotations

import json
import os
import stat
from typing import NamedTuple

import torch

from .structure import CompressedCheckpointError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
#: Largest shard index read (a real one names a few thousand tensors: well under a megabyte).
MAX_INDEX_BYTES = 64 << 20
RESTORE_INDEX = f"restore {WEIGHTS_INDEX_NAME} and the shards from the saved checkpoint"

#: safetensors' dtype names (the header's), as torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class StoredTensor(NamedTuple):
    """One tensor as a safetensors header describes it (nothing else is read)."""

    file: str
    dtype: torch.dtype | str  # the header's name where torch has no such dtype
    shape: tuple[int, ...]


def _weight_files(folder: str) -> list[str]:
    """The safetensors files of a local checkpoint (one, or those its index names, each checked by ``_shard``)."""
    index = os.path.join(folder, WEIGHTS_INDEX_NAME)
    if not os.path.isfile(index):
        return [WEIGHTS_NAME] if os.path.isfile(os.path.join(folder, WEIGHTS_NAME)) else []
    if os.path.getsize(index) > MAX_INDEX_BYTES:
        raise CompressedCheckpointError(f"{index} is larger than an index of shards can be; {RESTORE_INDEX}")
    with open(index, encoding="utf-8") as handle:
        try:
            weight_map = json.load(handle).get("weight_map")
        except (ValueError, AttributeError):
            weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise CompressedCheckpointError(f"{index} holds no weight_map of file names; {RESTORE_INDEX}")
    return [_shard(folder, name) for name in sorted(set(weight_map.values()))]


def _shard(folder: str, name: str) -> str:
    """``name``, a shard an index names, where it is a regular file inside ``folder``: a path that leaves the folder
    (``..``, an absolute path) is refused, as is a FIFO or a device, which would hang or never end the header read."""
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or any(part in ("", ".", "..") for part in parts):
        raise CompressedCheckpointError(
            f"{WEIGHTS_INDEX_NAME} names the shard {name!r}, a path outside the checkpoint's folder; every shard "
            f"must be a file inside it: {RESTORE_INDEX}"
        )
    try:
        status = os.stat(os.path.join(folder, name))
    except FileNotFoundError:
        raise CompressedCheckpointError(f"{WEIGHTS_INDEX_NAME} names the shard {name!r}, which is missing") from None
    if not stat.S_ISREG(status.st_mode):
        raise CompressedCheckpointError(
            f"{WEIGHTS_INDEX_NAME} names the shard {name!r}, which is not a regular file (a FIFO, a device or a "
            f"folder): {RESTORE_INDEX}"
        )
    return name


def stored_tensors(folder: str | os.PathLike | None) -> dict[str, StoredTensor]:
    """``{key: StoredTensor}`` of a local checkpoint's safetensors files, read from their headers only: transformers
    loads a buffer in the file's dtype or casts it into the model's, so the file's own dtype is read here. Empty for
    a folder that is not local."""
    from safetensors import safe_open

    if folder is None or not os.path.isdir(str(folder)):
        return {}
    tensors = {}
    for name in _weight_files(str(folder)):
        with safe_open(os.path.join(str(folder), name), framework="pt") as handle:
            for key in handle.keys():
                piece = handle.get_slice(key)
                dtype = piece.get_dtype()
                tensors[key] = StoredTensor(name, SAFETENSORS_DTYPES.get(dtype, dtype), tuple(piece.get_shape()))
    return tensors


def stored_metadata(folder: str | os.PathLike | None) -> dict[str, str]:
    """The safetensors metadata of a local checkpoint's files (torchao describes its flattened tensors there)."""
    from safetensors import safe_open

    if folder is None or not os.path.isdir(str(folder)):
        return {}
    metadata = {}
    for name in _weight_files(str(folder)):
        with safe_open(os.path.join(str(folder), name), framework="pt") as handle:
            metadata.update(handle.metadata() or {})
    return metadata


def local_folder(pretrained: str | os.PathLike | None, **source) -> str | None:
    """The local folder holding a checkpoint: ``pretrained`` itself, or the Hub cache's copy of a repo id that
    ``from_pretrained`` has downloaded (``source``: its ``cache_dir``, ``revision``, ``subfolder``); None if neither."""
    if pretrained is None:
        return None
    if os.path.isdir(str(pretrained)):
        return str(pretrained)
    try:
        from transformers.utils import cached_file

        options = {key: source[key] for key in ("cache_dir", "revision", "subfolder") if source.get(key) is not None}
        found = cached_file(
            str(pretrained),
            "config.json",
            local_files_only=True,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **options,
        )
    except (OSError, ValueError):
        return None
    return os.path.dirname(found) if found else None


def file_of(stored: dict[str, StoredTensor], key: str) -> str:
    """The file holding ``key`` (or a key that differs only by the base model prefix), else the usual file name."""
    for name, found in stored.items():
        if name == key or name.endswith("." + key) or key.endswith("." + name):
            return found[0]
    return WEIGHTS_NAME


def saved_config(folder: str | os.PathLike | None) -> dict:
    """A local checkpoint's ``config.json`` as it is on disk, or ``{}`` where there is no such file."""
    path = os.path.join(str(folder), "config.json") if folder is not None else ""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    return config if isinstance(config, dict) else {}


def saved_compression(folder: str | os.PathLike) -> dict:
    """``compression_config`` as a local checkpoint's ``config.json`` holds it (module names as the file's keys
    spell them), or ``{}`` where there is no such file."""
    compression = saved_config(folder).get("compression_config")
    return compression if isinstance(compression, dict) else {}
