"""What makes a compressed model save with self-contained code: its class, ``auto_map``, ``compression_config``,
and the modeling files written next to the weights.

The files that ship inside checkpoints are listed once, in ``SHIPPED_FILES``. In the package they live with their
method (``methods/cp/layer.py``, ...); a checkpoint holds them flat under the names given here, which is the layout
``trust_remote_code`` loading needs (transformers copies a modeling file and its sibling imports). Their relative
imports are rewritten to those flat names when written; a shipped file may import only torch, transformers and
other shipped files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import transformers
from torch import nn

from ..config import CompressionConfig
from .contract import QUANTIZATION_MARKER
from .modeling_tensorcompress import CompressedModelMixin, compressed_class

REMOTE_MODULE = "modeling_tensorcompress"
PACKAGE = Path(__file__).resolve().parent.parent
PACKAGE_NAME = "hf_tensorcompress"

#: Path inside the package -> file name inside a checkpoint.
SHIPPED_FILES: dict[str, str] = {
    "core/modeling_tensorcompress.py": f"{REMOTE_MODULE}.py",
    "core/structure.py": "structure.py",
    "core/contract.py": "contract.py",
    "core/lowbit.py": "lowbit.py",
    "core/factor_storage.py": "factor_storage.py",
    "methods/cp/layer.py": "cp_layer.py",
    "methods/svd/layer.py": "svd_layer.py",
    "methods/biprop/layer.py": "biprop_layer.py",
    "methods/biprop/attention.py": "biprop_attention.py",
    "methods/tt/layer.py": "tt_layer.py",
    "methods/tt/scaled.py": "tt_scaled_layer.py",
}

_RELATIVE_IMPORT = re.compile(r"^(\s*)from (\.+)([\w.]*) import ", re.MULTILINE)


def _module_of(path: str) -> str:
    return ".".join([PACKAGE_NAME, *Path(path).with_suffix("").parts])


def shipped_source(path: str) -> str:
    """The text of shipped file ``path`` with its relative imports pointing at the flat checkpoint names."""
    flat = {_module_of(source): Path(name).stem for source, name in SHIPPED_FILES.items()}
    package = _module_of(path).rpartition(".")[0]

    def rewrite(match: re.Match) -> str:
        indent, dots, name = match.groups()
        base = package.rsplit(".", len(dots) - 1)[0] if len(dots) > 1 else package
        target = f"{base}.{name}" if name else base
        if target not in flat:
            raise ValueError(f"shipped file {path} imports {dots}{name}, which is not shipped; see SHIPPED_FILES")
        return f"{indent}from .{flat[target]} import "

    return _RELATIVE_IMPORT.sub(rewrite, (PACKAGE / path).read_text(encoding="utf-8"))


def write_modeling_code(folder: str | os.PathLike) -> list[Path]:
    """Write every shipped file into ``folder`` (a checkpoint), flat; returns the written paths."""
    written = []
    for source, name in SHIPPED_FILES.items():
        target = Path(folder) / name
        target.write_text(shipped_source(source), encoding="utf-8")
        written.append(target)
    return written


def after_save(model: nn.Module, folder: str | os.PathLike, repo_id: str | None = None) -> None:
    """``CompressedModelMixin.save_hook`` where the library is installed: the modeling code, then the model card."""
    from ..hub import write_model_card

    write_modeling_code(folder)
    write_model_card(model, folder, repo_id=repo_id)


CompressedModelMixin.save_hook = staticmethod(after_save)


def auto_classes_for(base: type[nn.Module], config) -> list[str]:
    """``AutoModel`` plus every ``AutoModelFor*`` whose mapping resolves this config to ``base``."""
    names = ["AutoModel"]
    for name in dir(transformers):
        if not name.startswith("AutoModelFor"):
            continue
        mapping = getattr(getattr(transformers, name), "_model_mapping", None)
        try:
            if mapping is not None and mapping[type(config)] is base:
                names.append(name)
        except (KeyError, ValueError, ImportError, AttributeError):
            continue
    return names


def mark_compressed(model: nn.Module, recorded: CompressionConfig) -> None:
    """Make ``model`` a ``Compressed<Class>``, record the config, point ``auto_map`` at the shipped code and
    ``quantization_config`` at the registered quantizer (native loading, ``core/quantizer.py``)."""
    base = type(model)
    model.__class__ = compressed_class(base)
    model.config.compression_config = recorded.to_dict()
    model.config.quantization_config = dict(QUANTIZATION_MARKER)
    class_name = model.__class__.__name__
    auto_map = dict(getattr(model.config, "auto_map", None) or {})
    auto_map.update({auto: f"{REMOTE_MODULE}.{class_name}" for auto in auto_classes_for(base, model.config)})
    model.config.auto_map = auto_map
