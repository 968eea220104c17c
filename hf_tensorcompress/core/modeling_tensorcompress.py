"""Entry point of the code saved next to every compressed checkpoint (``trust_remote_code=True``).

``Compressed<Base>`` is ``<Base>`` (any transformers model class) whose ``__init__`` re-installs the compressed
layers recorded in ``config.compression_config``, so the checkpoint's tensors load into the right shapes. The
classes are made on first access (module ``__getattr__``), which is how ``auto_map`` entries such as
``modeling_tensorcompress.CompressedPatchTSTForPrediction`` resolve where hf_tensorcompress is not installed.
Imports: torch, transformers and sibling files only.
"""

from __future__ import annotations

import transformers
from torch import nn

from .structure import CompressedCheckpointError, install_layers, install_model_options

CLASS_PREFIX = "Compressed"


class CompressedModelMixin:
    """Re-installs the compressed layers after the base model's ``__init__`` and checks what was loaded."""

    #: ``save_hook(model, folder, repo_id=None)`` writes the modeling code and the model card next to the weights;
    #: hf_tensorcompress sets it on import. Where only this shipped code is loaded (``trust_remote_code``) it stays
    #: None: transformers registers the class for its Auto class then, and copies these files itself.
    save_hook = None

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        compression = getattr(config, "compression_config", None) or {}
        install_layers(self, compression.get("modules", {}))
        install_model_options(self, compression)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``, plus the modeling code and model card when hf_tensorcompress is
        installed."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if self.save_hook is not None and kwargs.get("is_main_process", True):
            self.save_hook(self, save_directory)
        return result

    def _upload_modified_files(self, working_dir, repo_id, *args, **kwargs):
        # push_to_hub replaces the saved README.md with transformers' generic card just before this upload step;
        # write ours again, now knowing the repo id.
        if self.save_hook is not None:
            self.save_hook(self, working_dir, repo_id=repo_id)
        return super()._upload_modified_files(working_dir, repo_id, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """``PreTrainedModel.from_pretrained`` that refuses checkpoints whose compressed tensors are missing or misshapen."""
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        except RuntimeError as error:
            if "mismatch" not in str(error):  # "size mismatch" (torch) / "ignore_mismatched_sizes" (transformers 5)
                raise
            raise CompressedCheckpointError(
                "The checkpoint's tensors do not have the shapes its compression_config describes (the load report "
                "above lists them); the config.json and the weights come from different models, or the config was "
                f"edited. Save the compressed model again with save_pretrained. ({error})"
            ) from error
        compressed = tuple((model.config.compression_config or {}).get("modules", {}))
        problems = {
            kind: sorted(key for key in info.get(kind, ()) if _is_key_of(key, compressed))
            for kind in ("missing_keys", "mismatched_keys")
        }
        if any(problems.values()):
            raise CompressedCheckpointError(
                "The checkpoint does not match its compression_config: "
                + "; ".join(f"{kind}: {keys[:6]}" for kind, keys in problems.items() if keys)
                + ". Save the model again with save_pretrained, or fix compression_config in config.json."
            )
        return (model, info) if wants_info else model

    # ``resize_token_embeddings`` builds a new dense nn.Embedding / nn.Linear from ``old.weight``; a compressed
    # layer offering ``resized(new_num_tokens, pad_to_multiple_of)`` resizes itself instead (e.g. TTEmbedding).
    def _get_resized_embeddings(self, old_embeddings, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        if hasattr(old_embeddings, "resized"):
            return old_embeddings.resized(new_num_tokens, pad_to_multiple_of)
        return super()._get_resized_embeddings(old_embeddings, new_num_tokens, pad_to_multiple_of, mean_resizing)

    def _get_resized_lm_head(self, old_lm_head, new_num_tokens=None, transposed=False, mean_resizing=True):
        if hasattr(old_lm_head, "resized"):
            return old_lm_head.resized(new_num_tokens)
        return super()._get_resized_lm_head(old_lm_head, new_num_tokens, transposed, mean_resizing)

    def resize_token_embeddings(self, *args, **kwargs):
        """``PreTrainedModel.resize_token_embeddings``, then re-record the compressed specs (vocabulary size)."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        modules = (self.config.compression_config or {}).get("modules", {})
        for name in modules:
            modules[name] = self.get_submodule(name).spec()
        return embeddings


def _is_key_of(key, module_names: tuple[str, ...]) -> bool:
    key = key[0] if isinstance(key, tuple) else key
    return any(key.startswith(name + ".") or f".{name}." in key for name in module_names)


_CLASSES: dict[str, type] = {}


def compressed_class(base: type[nn.Module]) -> type[nn.Module]:
    """The ``Compressed<Base>`` subclass of a transformers model class (made once, then reused)."""
    if issubclass(base, CompressedModelMixin):
        return base
    name = CLASS_PREFIX + base.__name__
    if name not in _CLASSES:
        _CLASSES[name] = type(name, (CompressedModelMixin, base), {"__module__": __name__})
    return _CLASSES[name]


def __getattr__(name: str) -> type[nn.Module]:
    if name.startswith(CLASS_PREFIX):
        base = getattr(transformers, name[len(CLASS_PREFIX) :], None)
        if isinstance(base, type) and issubclass(base, transformers.PreTrainedModel):
            return compressed_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
