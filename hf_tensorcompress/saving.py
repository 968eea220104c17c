"""What the library adds when a compressed model is saved or pushed: the modeling code of its method (so the
checkpoint loads with ``trust_remote_code`` where this library is absent) and the model card.

``compressed_class(base, save_hook=save_extras)`` gives the classes the library makes (``apply_compression``, the
transformers quantizer, ``loading``) this hook; the checkpoint's own copy of the code makes classes without it.
"""

from __future__ import annotations

import os

from torch import nn

from .core.export import optional_files, write_modeling_code
from .core.registry import get_method
from .runtime.modeling_tensorcompress import compressed_class


def save_extras(model: nn.Module, folder: str | os.PathLike, repo_id: str | None = None) -> None:
    """``Compressed<Base>.save_hook``: the shipped files of the model's method and of the optional runtime files it
    uses, then the model card."""
    from .hub import write_model_card  # huggingface_hub's card code: only when saving

    method = get_method(model.config.compression_config["method"])
    write_modeling_code(folder, [method], optional_files(model))
    write_model_card(model, folder, repo_id=repo_id)


def library_class(base: type[nn.Module]) -> type[nn.Module]:
    """``Compressed<Base>`` as the library makes it: saving writes the modeling code and the model card."""
    return compressed_class(base, save_extras)
