"""Entry point of the code saved next to every compressed checkpoint (``trust_remote_code=True``), and the structure
the library's quantizer (``core/quantizer.py``) gives a model built from such a checkpoint.

``Compressed<Base>`` is ``<Base>`` (any transformers model class) whose ``__init__`` re-installs the compressed
layers recorded in ``config.compression_config``, so the checkpoint's tensors load into the right shapes. The
classes are made on first access (module ``__getattr__``), which is how ``auto_map`` entries such as
``modeling_tensorcompress.CompressedPatchTSTForPrediction`` resolve where hf_tensorcompress is not installed.

A checkpoint refuses to load into a plain transformers class: ``save_pretrained`` writes, for every replaced module,
the key of its dense weight (``<module>.weight``) as a uint8 scalar tombstone. The plain class expects a matrix
there, so transformers reports a size mismatch and ``from_pretrained`` raises instead of initialising the module
at random; our classes expect no such key and skip it (``_keys_to_ignore_on_load_unexpected``).
Imports: torch, transformers and sibling files only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

import torch
import transformers
from torch import nn
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING

from .atomic import atomic_folder, recover
from .checkpoint_files import local_folder
from .checks import check_before_loading, check_loaded, check_shapes
from .contract import QUANT_METHOD, SIGNPOST_KEYS, TOMBSTONE_KEY, CompressedLayer, tombstones
from .marker import marker_version_problem
from .optional import sibling
from .structure import CompressedCheckpointError, active_options, install_layers, install_model_options

CLASS_PREFIX = "Compressed"


def compression_of(config) -> dict:
    """``config.compression_config``, or an error saying the config is not a compressed checkpoint's (or one whose
    ``quantization_config`` version this code does not read)."""
    marker = getattr(config, "quantization_config", None)
    if isinstance(marker, dict) and marker.get("quant_method") == QUANT_METHOD:
        problem = marker_version_problem(marker.get("version", 1))
        if problem is not None:
            raise CompressedCheckpointError(problem)
    compression = getattr(config, "compression_config", None)
    if not isinstance(compression, dict) or not isinstance(compression.get("modules"), dict):
        raise CompressedCheckpointError(
            "config.json names hf_tensorcompress's modeling code (auto_map or quantization_config "
            f"quant_method={QUANT_METHOD!r}) but has no compression_config with the module specs, so the compressed "
            "layers cannot be rebuilt. The config was edited or written by hand: save the compressed model again with "
            "save_pretrained, or remove auto_map/quantization_config to load the dense model."
        )
    return compression


def for_this_class(model: nn.Module, compression: dict) -> dict:
    """The specs with module names as ``model`` spells them: a head class's checkpoint (``model.encoder…``) loaded
    into the base class (``encoder…``, as ``AutoModel`` does) or the other way round, via ``base_model_prefix``."""
    names = {name for name, _ in model.named_modules()}
    prefix = getattr(model, "base_model_prefix", "") + "."

    def rename(name: str) -> str:
        if name in names:
            return name
        if name.startswith(prefix) and name[len(prefix) :] in names:
            return name[len(prefix) :]
        if prefix + name in names:
            return prefix + name
        return name  # install_layers names the module it cannot find

    # a head class's checkpoint loaded into the base class: its modules outside the base model (the head's own
    # Linears) are not built, as transformers drops the head's weights
    into_base = getattr(model, "base_model", model) is model and type(model).__name__ not in (
        getattr(model.config, "architectures", None) or [type(model).__name__]
    )
    outside = lambda name: name not in names and not name.startswith(prefix) and prefix + name not in names  # noqa: E731
    modules = {
        rename(n): {**spec, "source": rename(spec["source"])} if "source" in spec else spec  # a shared Linear's
        for n, spec in compression["modules"].items()
        if not (into_base and outside(n))
    }
    renamed = {**compression, "modules": modules}
    if "attention_modules" in compression:
        renamed["attention_modules"] = [rename(name) for name in compression["attention_modules"]]
    return renamed


class _NothingSkipped(logging.Filter):
    """Drops transformers' "Unknown quantization type, got tensorcompress … we will skip the quantization" warning,
    which appears where hf_tensorcompress is not installed: there ``Compressed<Base>`` rebuilds the compressed
    layers itself, so nothing is skipped and the advice to delete ``quantization_config`` would only break the
    refusal of plain classes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Unknown quantization type") and f"got {QUANT_METHOD} " in message)


def is_compressed(model: nn.Module) -> bool:
    """Whether ``model`` is a ``Compressed<Base>``: this file's or another copy of it (remote code)."""
    return any(cls.__name__ == CompressedModelMixin.__name__ for cls in type(model).__mro__)


def _expect_tombstones(model: nn.Module, module_names) -> None:
    patterns = {re.escape(name) + rf"\.{TOMBSTONE_KEY}$" for name in module_names} | {
        "^" + re.escape(key) + "$" for key in SIGNPOST_KEYS
    }
    model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ()) | patterns


def make_compressed(model: nn.Module, save_hook=None) -> nn.Module:
    """Give a model built from a compressed checkpoint's ``config.json`` its compressed structure, in place: the class
    ``Compressed<Base>`` (with ``save_hook``, see ``compressed_class``), empty layers from the specs (on the device
    and dtype of what they replace: the meta device while ``from_pretrained`` builds), the model options; the
    tombstones become expected keys."""
    compression = model.config.compression_config = for_this_class(model, compression_of(model.config))
    if not is_compressed(model):
        model.__class__ = compressed_class(type(model), save_hook)
        install_layers(model, compression["modules"])
        install_model_options(model, compression)
    _expect_tombstones(model, compression["modules"])
    return model


def unloaded_tensors(model: nn.Module) -> list[str]:
    """Compressed tensors (layers and Q/K/V masks) the checkpoint did not fill: transformers flags every tensor it
    loads ``_is_hf_initialized``, and fills the others with uninitialised memory or a generic init."""
    compression = model.config.compression_config
    tensors = {
        f"{name}.{key}": value
        for name in compression["modules"]
        for key, value in model.get_submodule(name).state_dict(keep_vars=True).items()
    }
    for option in active_options(compression):
        tensors.update(option.tensors(model, compression))
    return sorted(key for key, value in tensors.items() if not getattr(value, "_is_hf_initialized", False))


class CompressedModelMixin:
    """Re-installs the compressed layers after the base model's ``__init__`` and checks what was loaded."""

    #: ``save_hook(model, folder, repo_id=None)`` writes the modeling code and the model card next to the weights:
    #: the library passes it to ``compressed_class`` for the classes it makes. Where only this shipped code is
    #: loaded (``trust_remote_code``) it is None: transformers registers the class for its Auto class then, and
    #: copies these files itself.
    save_hook = None

    def __init__(self, config, *args, **kwargs) -> None:
        compression = compression_of(config)
        super().__init__(config, *args, **kwargs)
        install_layers(self, compression["modules"])
        install_model_options(self, compression)
        _expect_tombstones(self, compression["modules"])

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' per-module init path (``_initialize_weights`` → ``_init_weights``): a compressed layer, which
        the base class's ``_init_weights`` does not know (or would treat as a dense ``nn.Embedding``), initialises
        itself with ``reset_parameters()`` unless the checkpoint filled it (transformers asks the model class
        loaded, e.g. ``AutoModel``'s base class, about every module, loaded or not, and ``reset_parameters`` writes
        in place where transformers' guarded init functions would skip loaded tensors); every other module as the
        base class does."""
        if isinstance(module, CompressedLayer):
            if not _loaded(module):
                with torch.no_grad():
                    module.reset_parameters()
            return
        super()._init_weights(module)

    def initialize_weights(self) -> None:
        """transformers' init, then ours for what its ``_init_weights`` cannot know (and does not reach: a submodel
        such as ``PatchTSTModel`` inits its children with its own ``_init_weights``). ``from_pretrained`` builds on the
        meta device and fills what the checkpoint lacks through this method: a compressed layer none of whose tensors
        was loaded gets ``reset_parameters()``, a Q/K/V mask its seeded draw. Layers already initialised
        (``_is_hf_initialized``, as ``apply_compression`` marks what it builds) are left alone."""

        compression = compression_of(self.config)
        modules = dict(self.named_modules())  # during __init__ (post_init) the layers are not installed yet
        layers = [m for m in modules.values() if isinstance(m, CompressedLayer) and _unfilled(m)]
        options = active_options(compression)
        unfilled = {
            key: tensor
            for option in options
            for key, tensor in option.tensors(self, compression).items()
            if not getattr(tensor, "_is_hf_initialized", False)
            and not getattr(modules.get(key.rpartition(".")[0]), "_is_hf_initialized", False)
        }
        super().initialize_weights()
        with torch.no_grad():
            for layer in layers:  # a submodel's _init_weights flags them initialised without knowing them
                layer.reset_parameters()
                layer._is_hf_initialized = True
            fresh = (
                {k: v for option in options for k, v in option.initial_tensors(self, compression).items()}
                if unfilled
                else {}
            )
            for key, tensor in unfilled.items():
                tensor.copy_(fresh[key])

    def dequantize(self):
        """The dense model of the base class with every compressed layer's weight rebuilt (``decompress``)."""
        from .decompress import decompress

        return decompress(self)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained`` with a tombstone under each replaced module's dense key, plus the
        modeling code and model card when hf_tensorcompress is installed. The main process writes all of it into a
        staging folder that then replaces ``save_directory`` (``atomic.py``): a failed save leaves the old folder."""
        state_dict = kwargs.pop("state_dict", None)
        state_dict = dict(self.state_dict() if state_dict is None else state_dict)
        state_dict.update(tombstones(compression_of(self.config)["modules"]))
        if not kwargs.get("is_main_process", True):
            return super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)
        if kwargs.get("push_to_hub"):  # transformers names the repo after the folder it is given
            kwargs.setdefault("repo_id", os.path.basename(os.path.normpath(str(save_directory))))
        with atomic_folder(save_directory) as staging:
            result = super().save_pretrained(str(staging), *args, state_dict=state_dict, **kwargs)
            if self.save_hook is not None:
                self.save_hook(self, staging)
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """torch's ``load_state_dict`` (the Trainer resuming a checkpoint) reads the signpost as an unexpected key;
        it only speaks to plain classes, so it is dropped."""
        for key in SIGNPOST_KEYS:
            state_dict.pop(prefix + key, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        if isinstance(source, (str, os.PathLike)):  # a save killed mid-way: its previous folder back first
            with contextlib.suppress(OSError):
                recover(source)
        folder = local_folder(source, **kwargs)
        # One load path: where the library's quantizer is registered, transformers runs it for this checkpoint and
        # it makes the checks below (the same functions); here they run where only this shipped code is loaded.
        checked_by_quantizer = QUANT_METHOD in AUTO_QUANTIZER_MAPPING
        if not checked_by_quantizer:
            check_before_loading(folder)
        adapter = sibling("torchao_linears")  # carried by checkpoints with torchao-quantized Linears only
        marker = adapter.before_torchao_loading(cls, source, kwargs) if adapter is not None else None
        quantizer_log = logging.getLogger("transformers.quantizers.auto")
        quiet = _NothingSkipped()
        quantizer_log.addFilter(quiet)
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        except RuntimeError as error:
            if "mismatch" not in str(error):  # "size mismatch" (torch) / "ignore_mismatched_sizes" (transformers 5)
                raise
            if folder is not None:  # name the file, the key and the spec
                check_shapes(folder)
            raise CompressedCheckpointError(
                "The checkpoint's tensors do not have the shapes its compression_config describes (the load report "
                "above lists them); the config.json and the weights come from different models, or the config was "
                f"edited. Save the compressed model again with save_pretrained. ({error})"
            ) from error
        finally:
            quantizer_log.removeFilter(quiet)
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
        if not checked_by_quantizer:
            check_loaded(model, folder or local_folder(model.config.name_or_path))
        if marker is not None:
            adapter.after_torchao_loading(model, marker)
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


def _loaded(module: nn.Module) -> bool:
    """Whether any tensor of ``module`` was filled from a checkpoint (transformers flags it ``_is_hf_initialized``)."""
    return any(getattr(t, "_is_hf_initialized", False) for t in module.state_dict(keep_vars=True).values())


def _unfilled(module: nn.Module) -> bool:
    """Whether ``module`` was neither loaded nor initialised already (transformers flags a module it has initialised,
    and ``apply_compression`` one it built, ``_is_hf_initialized``)."""
    return not getattr(module, "_is_hf_initialized", False) and not _loaded(module)


def _is_key_of(key, module_names: tuple[str, ...]) -> bool:
    key = key[0] if isinstance(key, tuple) else key
    return any(key.startswith(name + ".") or f".{name}." in key for name in module_names)


_CLASSES: dict[tuple[type, object], type] = {}


def compressed_class(base: type[nn.Module], save_hook=None) -> type[nn.Module]:
    """The ``Compressed<Base>`` subclass of a transformers model class (made once per hook, then reused).

    ``save_hook(model, folder, repo_id=None)`` runs after ``save_pretrained`` and before a Hub upload: the library
    passes its writer of the modeling code and model card; the remote-code path passes none."""
    if issubclass(base, CompressedModelMixin):
        base = next(cls for cls in base.__mro__ if not issubclass(cls, CompressedModelMixin))
    key = (base, save_hook)
    if key not in _CLASSES:
        hook = None if save_hook is None else staticmethod(save_hook)
        _CLASSES[key] = type(
            CLASS_PREFIX + base.__name__, (CompressedModelMixin, base), {"__module__": __name__, "save_hook": hook}
        )
    return _CLASSES[key]


def __getattr__(name: str) -> type[nn.Module]:
    if name.startswith(CLASS_PREFIX):
        base = getattr(transformers, name[len(CLASS_PREFIX) :], None)
        if isinstance(base, type) and issubclass(base, transformers.PreTrainedModel):
            return compressed_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
