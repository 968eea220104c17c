"""``CompressionConfig``: what to compress, with which method and how hard; validated, versioned, JSON round trip."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .layers.tt_embedding import TT_SOLVERS

CONFIG_VERSION = 1

#: Methods this version implements.
METHODS = ("cp", "svd", "biprop", "tt")

INITS = ("decompose", "random")

#: ``method="biprop"``: initialisations of the frozen random weights, and the attention options (DESIGN.md §3.3).
BIPROP_WEIGHT_INITS = ("kaiming_normal", "signed_constant")
BIPROP_ATTENTION = ("step_t", "qkv_mask")

TT_BASES = ("identity", "pca", "output")


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
        tt_shape: ``method="tt"``: the folding ``I_1 × … × I_N`` of each token vector (product = hidden size).
        tt_order: ``method="tt"``: N for an automatic balanced folding (used when ``tt_shape`` is None; default 3).
        tt_ranks: ``method="tt"``: maximum TT ranks, one int for all ``r_1 … r_{N-1}`` or a list of N-1 ints.
        tt_eps: ``method="tt"``: TT-SVD accuracy ε (paper Algorithm 1), alone or together with ``tt_ranks``.
        tt_basis: ``method="tt"``: the basis the trains are built in. ``"identity"`` (the paper), ``"pca"`` (principal
            axes of the embedding matrix) or ``"output"`` (output-aware: whitened by the covariance of the hidden
            states the tied output layer sees, then principal axes; needs calibration text, see
            ``methods.tt.apply_tt``). A non-identity basis stores one extra ``d×d`` matrix.
        tt_solver: ``method="tt"``: how TT-SVD finds each token's dominant subspaces. ``"eigh"`` (exact, LAPACK) or
            ``"power"`` (fixed ranks only, no ``tt_eps``: block power iteration, 2-3× faster on a whole vocabulary,
            reconstruction error 1.006× exact on SmolLM2 at 8×8×9, ranks 5,5). It pays off where each token's kept
            singular values are within a factor of ~3 of each other (small ranks); tokens with wider spectra fall
            back to ``eigh``, so at large ranks it is slower than ``"eigh"`` (see ``layers.tt_embedding``).
        tt_exact_tokens: ``method="tt"``: serve this many of the most frequent tokens of the calibration text from
            dense rows (exact), the rest from their trains (needs calibration text, see ``methods.tt.apply_tt``);
            capped at the number of distinct tokens the calibration text contains.
        tt_untie_output: ``method="tt"`` on a model with a tied output layer: keep a dense copy of the output
            matrix (the untied variant) instead of reading logits from the TT cores.
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
    tt_shape: list[int] | None = None
    tt_order: int | None = None
    tt_ranks: int | list[int] | None = None
    tt_eps: float | None = None
    tt_basis: str = "identity"
    tt_solver: str = "eigh"
    tt_exact_tokens: int = 0
    tt_untie_output: bool = False
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
        self._validate_tt()

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


    def _validate_tt(self) -> None:
        def positive_ints(value) -> bool:
            return isinstance(value, (list, tuple)) and bool(value) and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
            )

        if self.tt_shape is not None:
            if not positive_ints(self.tt_shape) or len(self.tt_shape) < 2:
                raise ValueError(f"tt_shape must be a list of >= 2 ints >= 1 (e.g. [8, 8, 9]), got {self.tt_shape!r}")
            if self.tt_order is not None and self.tt_order != len(self.tt_shape):
                raise ValueError(
                    f"tt_order={self.tt_order} contradicts tt_shape={self.tt_shape}; give one of them"
                )
            self.tt_shape = list(self.tt_shape)
        if self.tt_order is not None and (
            isinstance(self.tt_order, bool) or not isinstance(self.tt_order, int) or self.tt_order < 2
        ):
            raise ValueError(f"tt_order must be an int >= 2 (the number of TT cores), got {self.tt_order!r}")
        if self.tt_ranks is not None:
            ranks = [self.tt_ranks] if isinstance(self.tt_ranks, int) and not isinstance(self.tt_ranks, bool) else self.tt_ranks
            if not positive_ints(ranks):
                raise ValueError(f"tt_ranks must be an int >= 1 or a list of ints >= 1, got {self.tt_ranks!r}")
            if isinstance(self.tt_ranks, (list, tuple)):
                self.tt_ranks = list(self.tt_ranks)
                order = len(self.tt_shape) if self.tt_shape is not None else self.tt_order
                if order is not None and len(self.tt_ranks) != order - 1:
                    raise ValueError(
                        f"tt_ranks={self.tt_ranks} has {len(self.tt_ranks)} entries; a {order}-core train needs "
                        f"{order - 1} (or pass one int for all)"
                    )
        if self.tt_eps is not None and (
            isinstance(self.tt_eps, bool) or not isinstance(self.tt_eps, (int, float)) or not 0 < self.tt_eps < 1
        ):
            raise ValueError(f"tt_eps must be a float in (0, 1) (relative reconstruction error), got {self.tt_eps!r}")
        if self.tt_basis not in TT_BASES:
            raise ValueError(f"tt_basis={self.tt_basis!r} is not supported; choose one of {list(TT_BASES)}")
        if self.tt_solver not in TT_SOLVERS:
            raise ValueError(f"tt_solver={self.tt_solver!r} is not supported; choose one of {list(TT_SOLVERS)}")
        if self.tt_solver == "power" and (self.tt_eps is not None or self.tt_ranks is None):
            raise ValueError(
                "tt_solver='power' keeps fixed ranks: give tt_ranks and no tt_eps (the ε mode needs every singular "
                "value; use tt_solver='eigh')"
            )
        if isinstance(self.tt_exact_tokens, bool) or not isinstance(self.tt_exact_tokens, int) or self.tt_exact_tokens < 0:
            raise ValueError(f"tt_exact_tokens must be an int >= 0 (tokens kept dense), got {self.tt_exact_tokens!r}")
        if self.method == "tt" and self.tt_ranks is None and self.tt_eps is None:
            raise ValueError("method='tt' needs tt_ranks (max TT ranks), tt_eps (accuracy), or both")

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
