"""The contract every replacement layer implements, and the registry of layer types that checkpoints name.

Ships inside saved checkpoints (imports torch only). A subclass with a ``layer_type`` registers itself, so
``CompressedLayer.types[spec["type"]]`` rebuilds any recorded layer without a hand-kept list; a ``ModelOption``
subclass (behaviour a method records beside its layers) likewise registers under its ``key``.
"""

from __future__ import annotations

from functools import cache
from typing import ClassVar

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from .marker import LINEARS_KEY, QUANT_METHOD, QUANTIZATION_MARKER, STACKED_VERSION, quantization_marker  # noqa: F401

#: The dense key a compressed module no longer has; checkpoints hold a tombstone there (``modeling_tensorcompress``).
TOMBSTONE_KEY = "weight"

#: A one-byte tensor every checkpoint holds under this key: where the library's loader is not registered (the library
#: is not imported, or not installed), a plain transformers class lists it in its load report (an unexpected key)
#: right beside the tombstones' size mismatch, so the report names the fix; transformers' own error text is fixed.
#: No digits, dots or parentheses: the report groups on digits and dots, and transformers reads the key as a regex
#: pattern when it renames keys (a group would be written back as a backreference).
SIGNPOST_KEY = (
    "hf_tensorcompress checkpoint: import hf_tensorcompress first, pip install it if missing, or pass "
    "trust_remote_code=True"
)

#: Every signpost a checkpoint may hold: this version's, and the one earlier versions wrote (its advice to install
#: the library misled where it was installed but not imported). Library classes ignore all of them.
SIGNPOST_KEYS = (
    SIGNPOST_KEY,
    "hf_tensorcompress checkpoint: pip install hf_tensorcompress, or pass trust_remote_code=True",
)


def tombstones(module_names) -> dict[str, torch.Tensor]:
    """One uint8 scalar per replaced module, under its dense weight's key, and the signpost naming the fix."""
    marks = {f"{name}.{TOMBSTONE_KEY}": torch.zeros((), dtype=torch.uint8) for name in module_names}
    return {**marks, SIGNPOST_KEY: torch.zeros((), dtype=torch.uint8)}


#: The attribute an attention module carries where a method changed what it computes: ``cost(module, steps) ->
#: {"qk": …, "av": …}``, the multiply-adds of ``QKᵀ`` and ``AV`` for one sequence (``nonzero_flops`` reads it).
ATTENTION_COST = "compressed_attention_multiply_adds"


class TensorProblem(ValueError):
    """A loaded tensor that no saved layer holds (``check_state``): ``key`` names it relative to the module that
    raises, so the load-time check (``runtime/checks.py``) can name the file and the full key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


def expect_tensor(tensor: torch.Tensor, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """``tensor`` has exactly ``dtype`` and ``shape`` (a kernel or an index would otherwise read past it)."""
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        raise TensorProblem(
            key, f"is {tensor.dtype} of shape {list(tensor.shape)}, where {dtype} of shape {list(shape)} is stored"
        )


def _mark_stepped(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    """Every parameter an optimizer step may have changed, marked changed (its version counter bumped)."""
    for group in optimizer.param_groups:
        torch.autograd.graph.increment_version(group["params"])


@cache
def watch_optimizer_steps() -> RemovableHandle:
    """Bump the version of every parameter after each optimizer step, once per process.

    Layers cache what they derive from their parameters (packed codes, a rounded or rebuilt weight) by the
    parameters' version counters, and a fused optimizer (``torch.optim.AdamW(fused=True)``, the Trainer's default
    ``adamw_torch_fused``) writes the parameters without bumping them: without this, evaluation between training
    steps would keep serving the weights of the first evaluation. Other optimizers bump them already; once more
    changes nothing."""
    return register_optimizer_step_post_hook(_mark_stepped)


class CompressedLayer(nn.Module):
    """A module that replaces a dense one. What the library relies on:

    - ``spec()`` / ``from_spec(spec)``: the JSON-able structure (type, shapes, ranks) recorded in
      ``config.compression_config["modules"]``, and an empty layer of that structure to load weights into;
    - ``dense_parameters()`` / ``dense_multiply_adds(tokens)``: the cost of the module it replaced;
    - ``stored_parameters()`` / ``storage_bits()`` / ``multiply_adds(tokens, cached)``: its own cost as stored and
      as run at inference (``(count, path)``, the path naming how the forward computes it);
    - ``bind(model)``: a hook run once every layer of a model is installed (for layers that act beyond their
      own module, e.g. a TT embedding that also serves a tied output layer);
    - ``reset_parameters()``: a fresh init of every parameter and persistent buffer, meta-safe. transformers builds
      models on the meta device and initialises what the checkpoint did not fill through ``_init_weights``, which
      knows no factor or core: ``Compressed<Base>._init_weights`` calls this instead.
    The state dict must not use the key ``weight``: that key is the dense module's, and a checkpoint writes it as a
    tombstone (see ``modeling_tensorcompress``).
    Layers whose rank can change also offer ``set_rank(rank, n_iter=None) -> {old: new parameter}`` (``n_iter``:
    refit sweeps for layers that refit iteratively; the rank search passes it to every layer).
    """

    layer_type: ClassVar[str] = ""
    #: Every layer class with a ``layer_type``, by that type (filled by ``__init_subclass__``).
    types: ClassVar[dict[str, type[CompressedLayer]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.layer_type:
            CompressedLayer.types[cls.layer_type] = cls

    def __new__(cls, *args, **kwargs) -> CompressedLayer:
        """Every layer, however its ``__init__`` chain runs (TT skips ``nn.Embedding.__init__``), watches optimizer
        steps: the caches of derived weights key on parameter versions."""
        watch_optimizer_steps()
        return super().__new__(cls)

    def spec(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must describe its structure in spec()")

    @classmethod
    def from_spec(cls, spec: dict) -> CompressedLayer:
        raise NotImplementedError(f"{cls.__name__} must build itself from a spec in from_spec()")

    def reset_parameters(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must initialise its tensors in reset_parameters()")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """torch's ``load_state_dict`` (e.g. the Trainer resuming a checkpoint) reads a checkpoint's tombstone as an
        unexpected key: it stands for the dense weight this layer replaced, so it is dropped."""
        tombstone = state_dict.get(prefix + TOMBSTONE_KEY)
        if isinstance(tombstone, torch.Tensor) and tombstone.dim() == 0:
            del state_dict[prefix + TOMBSTONE_KEY]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def dense_parameters(self) -> int:
        raise NotImplementedError

    def dense_multiply_adds(self, tokens: int) -> int:
        return 0

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        raise NotImplementedError

    def stored_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.parameters())

    def storage_bits(self) -> int:
        tensors = list(self.parameters()) + [buffer for _, buffer in self.named_buffers()]
        return sum(t.numel() * t.element_size() * 8 for t in tensors)

    def bind(self, model: nn.Module) -> None:
        """Nothing to do for a layer that only replaces its own module."""

    def check_state(self) -> None:
        """Raise ``TensorProblem`` for a loaded tensor of this module (not its submodules: each checks its own) whose
        values no saved layer holds, e.g. an index out of range. Dtypes, shapes and finiteness are checked for every
        layer by ``runtime/checks.py``; the default has nothing more to check."""

    def dense_weight(self) -> torch.Tensor:
        """The dense weight this layer computes (``nn.Linear``/``nn.Embedding`` orientation), for ``decompress``."""
        return self.weight

    def dense_bias(self) -> torch.Tensor | None:
        """The bias this layer adds (``None``: none), for ``decompress`` and export."""
        return getattr(self, "bias", None)

    def fill_dense(self, module: nn.Module) -> None:
        """Write this layer's dense weight (and bias) into ``module``, the dense module it replaced: ``decompress``
        builds that module empty from the model's own class, so its type and layout (e.g. GPT-2's ``Conv1D``, stored
        ``(in, out)``) are the original's."""
        weight = self.dense_weight().detach()
        if type(module).__name__ == "Conv1D":
            weight = weight.T
        module.weight.data.copy_(weight)
        if getattr(module, "bias", None) is not None:  # a layer without a bias computes a zero one
            bias = self.dense_bias()
            if bias is None:
                module.bias.data.zero_()
            else:
                module.bias.data.copy_(bias.detach())

    def unbind(self, model: nn.Module, reference: nn.Module) -> None:
        """Undo ``bind`` once ``decompress`` has put the dense module back; ``reference`` is a dense model of the
        base class on the meta device, from which modules ``bind`` replaced can be taken."""


def untie_word_embeddings(model: nn.Module) -> None:
    """Switch off the tying of the output layer to the token embedding, whose ``weight`` parameter a compressed
    embedding no longer has (transformers would tie ``lm_head.weight`` to it): in the config and in the model."""
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for config in {id(model.config): model.config, id(text_config): text_config}.values():
        if getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}


class TiedHead(nn.Linear):
    """The output layer of a tied model whose token embedding is a compressed layer: ``logits = h Wᵀ`` read from
    that embedding, which stores the matrix once. An ``nn.Linear`` to transformers (``get_output_embeddings()``
    returns one) whose ``weight`` is the embedding's; ``nn.Linear.__init__`` is not run, so it owns no tensors."""

    def __init__(self, embedding: nn.Module) -> None:
        nn.Module.__init__(self)
        self.register_parameter("bias", None)
        object.__setattr__(self, "embedding", embedding)  # a reference, not a submodule: no duplicate state

    @property
    def in_features(self) -> int:
        return self.embedding.embedding_dim

    @property
    def out_features(self) -> int:
        return self.embedding.num_embeddings

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def resized(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None) -> TiedHead:
        """Nothing to do: the head follows the embedding's vocabulary."""
        return self

    def extra_repr(self) -> str:
        return f"tied to {type(self.embedding).__name__}({self.out_features}, {self.in_features})"


class ModelOption:
    """Model-level behaviour a method records in ``compression_config`` beside its layers (e.g. biprop's SBT attention
    masks): re-installed on load, initialised where a checkpoint lacks its tensors. Defining a subclass with a ``key``
    (the ``compression_config`` entry that turns it on) registers it in ``ModelOption.options``."""

    key: ClassVar[str] = ""
    #: Every option class with a ``key``, by that key (filled by ``__init_subclass__``).
    options: ClassVar[dict[str, type[ModelOption]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.key:
            ModelOption.options[cls.key] = cls

    @classmethod
    def active(cls, compression: dict) -> bool:
        return compression.get(cls.key) is not None

    @classmethod
    def install(cls, model: nn.Module, compression: dict) -> None:
        raise NotImplementedError(f"{cls.__name__} must install itself on a model in install()")

    @classmethod
    def tensors(cls, model: nn.Module, compression: dict) -> dict[str, torch.Tensor]:
        """The persistent tensors the option owns, by full state-dict key (checked after loading)."""
        return {}

    @classmethod
    def initial_tensors(cls, model: nn.Module, compression: dict) -> dict[str, torch.Tensor]:
        """Fresh values for ``tensors`` (used where a checkpoint did not fill them)."""
        return {}

    @classmethod
    def dense_equivalent(cls, compression: dict) -> str | None:
        """Why a model with this option cannot become a plain dense model (``decompress``), or None if it can."""
        return None


class CompressedLinear(CompressedLayer):
    """A replacement for ``nn.Linear(in_features, out_features)``: the dense costs follow from the two sizes."""

    in_features: int
    out_features: int

    def dense_parameters(self) -> int:
        bias = getattr(self, "bias", None)
        return self.in_features * self.out_features + (self.out_features if bias is not None else 0)

    def dense_multiply_adds(self, tokens: int) -> int:
        return tokens * self.in_features * self.out_features

    def spec(self) -> dict:
        """The sizes every linear replacement records; subclasses add their own structure (e.g. the rank)."""
        return {
            "type": self.layer_type,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "bias": getattr(self, "bias", None) is not None,
        }
