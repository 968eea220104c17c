"""What makes a compressed model save with self-contained code: its class, ``auto_map`` and ``compression_config``."""

from __future__ import annotations

import transformers
from torch import nn

from .config import CompressionConfig
from .layers.modeling_tensorcompress import compressed_class

REMOTE_MODULE = "modeling_tensorcompress"


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
    """Make ``model`` a ``Compressed<Class>``, record the config, and point ``auto_map`` at the shipped code."""
    base = type(model)
    model.__class__ = compressed_class(base)
    model.config.compression_config = recorded.to_dict()
    class_name = model.__class__.__name__
    auto_map = dict(getattr(model.config, "auto_map", None) or {})
    auto_map.update({auto: f"{REMOTE_MODULE}.{class_name}" for auto in auto_classes_for(base, model.config)})
    model.config.auto_map = auto_map
