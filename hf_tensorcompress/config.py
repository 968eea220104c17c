"""``CompressionConfig``: what to compress, with which method and how hard; validated, versioned, JSON round trip."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

CONFIG_VERSION = 1

#: Methods this version implements.
METHODS = ("cp", "svd", "biprop")

INITS = ("decompose", "random")

#: ``method="biprop"``: initialisations of the frozen random weights, and the attention options (DESIGN.md §3.3).
BIPROP_WEIGHT_INITS = ("kaiming_normal", "signed_constant")
BIPROP_ATTENTION = ("step_t", "qkv_mask")


def _check_rank(value: Any, where: str) -> None:
    """An int >= 1 (the rank itself) or a float in (0, 1] (that fraction of the dense layer's parameters)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be an int >= 1 or a float in (0, 1], got {value!r}")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"{where}={value} is not a rank: use an int >= 1, or a float in (0, 1] for a parameter ratio")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(
            f"{where}={value} is outside (0, 1]: a float is the fraction of the dense layer's parameters to keep "
            f"(e.g. 0.5); pass an int for an absolute rank"
        )


@dataclass
class CompressionConfig:
    """How ``apply_compression`` rewrites a model.

    Args:
        method: ``"cp"`` (Smartformer CP attention), ``"svd"`` (truncated-SVD baseline) or ``"biprop"`` (Sparse
            Binary Transformers; default targets q/k/v/out projections, ``target_modules="all-linear"`` takes every
            Linear of the encoder as the paper does).
        target_modules: module names (a module matches if its full name equals or ends with ``.<name>``) or one
            regular expression matched against full names. ``None`` takes the model family's default
            (the q/k/v projections of every attention module for ``cp``/``svd``).
        rank: an int (the rank of every target) or a float in (0, 1]: the fraction of each dense layer's weight
            parameters the compressed layer may keep (rank rounded down, at least 1).
        ranks: per-module overrides, ``{name or suffix: rank}``, same rules as ``rank``.
        init: ``"decompose"`` (factors from the existing dense weights) or ``"random"``.
        cp_iterations: ALS iterations of the initial CP decomposition.
        keep_ratio: ``biprop``: fraction of each layer's weights KEPT. The paper calls it "prune rate p"; its code
            keeps that fraction, so ``keep_ratio=0.75`` is the paper's ``p=0.75``.
        weight_init: ``biprop``: ``"kaiming_normal"`` (default) or ``"signed_constant"`` frozen weights.
        weight_seed: ``biprop``: seed of the frozen weights (each layer mixes in a CRC of its name) and of the Q/K/V
            masks; the "weight seed" the paper averages over.
        save_scores: ``biprop``: also save the fp32 scores and weights (to resume training). Default ``False``:
            a checkpoint holds only the mask bits and one α per layer and loads for inference.
        attention: ``biprop``: ``None``, ``"step_t"`` (single-step forecasting / anomaly detection: earlier steps
            attend to themselves, the last step to every earlier step) or ``"qkv_mask"`` (fixed random masks on the
            Q/K/V activations, classification). Needs a model whose attention uses transformers'
            ``AttentionInterface`` (PatchTST, Informer's canonical attention).
        attention_keep_ratio: ``qkv_mask``: fraction of activations kept (the paper's ``p_a``); ``None`` = ``keep_ratio``.
        attention_length: ``qkv_mask``: the sequence length the masks cover; ``None`` derives it from the model
            config where it can (PatchTST: number of patches).
        attention_modules: filled by ``apply_compression``: the attention modules the ``attention`` option applies to.
        modules: filled by ``apply_compression``: the resolved spec of every replaced module (type, shapes,
            rank). It is what a saved checkpoint is rebuilt from; leave it empty when writing a config by hand.
    """

    method: str = "cp"
    target_modules: list[str] | str | None = None
    rank: int | float = 0.5
    ranks: dict[str, int | float] = field(default_factory=dict)
    init: str = "decompose"
    cp_iterations: int = 100
    keep_ratio: float = 0.5
    weight_init: str = "kaiming_normal"
    weight_seed: int = 0
    save_scores: bool = False
    attention: str | None = None
    attention_keep_ratio: float | None = None
    attention_length: int | None = None
    attention_modules: list[str] = field(default_factory=list)
    modules: dict[str, dict] = field(default_factory=dict)
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the wrong field and what would be right."""
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not supported; choose one of {list(METHODS)}")
        if not isinstance(self.version, int) or self.version > CONFIG_VERSION:
            raise ValueError(
                f"CompressionConfig version {self.version!r} is newer than this library understands "
                f"({CONFIG_VERSION}); upgrade hf_tensorcompress"
            )
        if self.target_modules is not None:
            if isinstance(self.target_modules, str):
                try:
                    re.compile(self.target_modules)
                except re.error as error:
                    raise ValueError(f"target_modules={self.target_modules!r} is not a valid regex: {error}") from None
            elif not (
                isinstance(self.target_modules, (list, tuple))
                and self.target_modules
                and all(isinstance(name, str) and name for name in self.target_modules)
            ):
                raise ValueError(
                    f"target_modules must be a non-empty list of module names, a regex string, or None for the "
                    f"model family's default; got {self.target_modules!r}"
                )
            else:
                self.target_modules = list(self.target_modules)
        _check_rank(self.rank, "rank")
        if not isinstance(self.ranks, dict):
            raise ValueError(f"ranks must be a dict {{module name: rank}}, got {type(self.ranks).__name__}")
        for name, value in self.ranks.items():
            _check_rank(value, f"ranks[{name!r}]")
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r} is not supported; choose one of {list(INITS)}")
        if isinstance(self.cp_iterations, bool) or not isinstance(self.cp_iterations, int) or self.cp_iterations < 1:
            raise ValueError(f"cp_iterations must be an int >= 1, got {self.cp_iterations!r}")
        self._validate_biprop()

    def _validate_biprop(self) -> None:
        for name in ("keep_ratio", "attention_keep_ratio"):
            value = getattr(self, name)
            if value is None and name == "attention_keep_ratio":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ValueError(
                    f"{name}={value!r} must be a float in (0, 1]: the fraction of weights (activations) KEPT, "
                    f"e.g. 0.5 (the paper's prune rate p is this number)"
                )
        if self.weight_init not in BIPROP_WEIGHT_INITS:
            raise ValueError(f"weight_init={self.weight_init!r} is not supported; choose one of {list(BIPROP_WEIGHT_INITS)}")
        if isinstance(self.weight_seed, bool) or not isinstance(self.weight_seed, int) or self.weight_seed < 0:
            raise ValueError(f"weight_seed must be an int >= 0, got {self.weight_seed!r}")
        if not isinstance(self.save_scores, bool):
            raise ValueError(f"save_scores must be True or False, got {self.save_scores!r}")
        if self.attention is not None and self.attention not in BIPROP_ATTENTION:
            raise ValueError(f"attention={self.attention!r} is not supported; choose None or one of {list(BIPROP_ATTENTION)}")
        if self.attention is not None and self.method != "biprop":
            raise ValueError(f"attention={self.attention!r} is a biprop option; use method='biprop' or attention=None")
        if self.attention_length is not None and (
            isinstance(self.attention_length, bool) or not isinstance(self.attention_length, int) or self.attention_length < 1
        ):
            raise ValueError(f"attention_length must be an int >= 1 or None, got {self.attention_length!r}")

    def rank_for(self, module_name: str) -> int | float:
        """The rank asked for ``module_name``: the longest matching key of ``ranks``, else ``rank``."""
        matches = [key for key in self.ranks if module_name == key or module_name.endswith("." + key)]
        return self.ranks[max(matches, key=len)] if matches else self.rank

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CompressionConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown CompressionConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json_string(cls, text: str) -> "CompressionConfig":
        return cls.from_dict(json.loads(text))

    def to_json_file(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(self.to_json_string() + "\n")

    @classmethod
    def from_json_file(cls, path: str) -> "CompressionConfig":
        with open(path, encoding="utf-8") as handle:
            return cls.from_json_string(handle.read())
