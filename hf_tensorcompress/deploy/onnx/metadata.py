"""What an exported file tells the runner, stored in the ONNX model's own metadata (one key, JSON), so a deployment
ships one file."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

KEY = "hf_tensorcompress"


def write_metadata(path: Path, metadata: dict) -> None:
    """Add ``metadata`` to the ONNX file at ``path`` (rewritten in place)."""
    model = onnx.load(str(path))
    entries = [entry for entry in model.metadata_props if entry.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(entries)
    model.metadata_props.add(key=KEY, value=json.dumps(metadata))
    onnx.save(model, str(path))


def read_metadata(path: str | Path) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    return next(json.loads(entry.value) for entry in model.metadata_props if entry.key == KEY)
