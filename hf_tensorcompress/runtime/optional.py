"""Shipped files a checkpoint carries only where it uses them: the C kernels of packed storage
(``lowbit_kernel``) and the adapters of stacked checkpoints' quantized Linears (``torchao_linears``, which imports
``bnb_linears``).

Their users reach them through ``sibling(name)``, never a static import, so a checkpoint without them still loads;
``core/export.py`` decides which ones a checkpoint carries, and its layer manifest imports those so that
``trust_remote_code`` copies them. Imports: the standard library only.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

#: The optional files, by module name.
OPTIONAL = ("lowbit_kernel", "torchao_linears", "bnb_linears")


@functools.cache
def sibling(name: str) -> ModuleType | None:
    """The optional file ``name`` of this folder (of the library, or of a checkpoint's code), or None where the
    checkpoint does not carry it."""
    try:
        return importlib.import_module(f".{name}", __package__)
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.{name}":
            raise  # the file is there but something it imports is missing: not ours to hide
        return None
