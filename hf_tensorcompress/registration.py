"""Registers ``quant_method="tensorcompress"`` with transformers as soon as transformers can load models.

``import hf_tensorcompress`` must be enough for ``AnyModel.from_pretrained(compressed_dir)`` to load natively, but
importing transformers' model machinery costs seconds, which the command line's ``--help`` must not pay. So the
registration runs now if ``transformers.modeling_utils`` (where ``from_pretrained`` lives) is already imported, and
otherwise right after it is first imported (a one-shot import hook), which is before any ``from_pretrained`` can
run. Not earlier: the quantizer's own imports need ``modeling_utils`` complete.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "transformers.modeling_utils"


def _register() -> None:
    from .quantizer import register_quantization

    register_quantization()


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` through the other finders and runs ``_register`` once its module has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _register()

        spec.loader.exec_module = exec_module
        return spec


def register_with_transformers() -> None:
    """Register now, or as soon as transformers' quantizer registry is imported."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
