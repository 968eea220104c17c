"""Options of ``method="biprop"`` (Sparse Binary Transformers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...config import CompressionConfig, check_choice, check_fraction, check_int, one_of

#: Initialisations of the frozen random weights.
WEIGHT_INITS = ("kaiming_normal", "signed_constant")
#: ``random``: the paper's init; ``dense``: started from the dense weights (``BipropLinear.start_from``).
BIPROP_INITS = ("random", "dense")
#: The paper's attention options.
ATTENTION_OPTIONS = ("step_t", "qkv_mask")


@dataclass
class BipropConfig(CompressionConfig):
    """Frozen random weights, learned scores that pick a mask, effective weight ``α · sign(W) ⊙ M``.

    Args:
        target_modules: ``None`` (q/k/v/out projections of every attention module), names, a regex, or
            ``"all-linear"`` (every Linear of the encoder, as the paper binarizes them all).
        keep_ratio: fraction of each layer's weights KEPT. The paper calls it "prune rate p"; its code keeps that
            fraction, so ``keep_ratio=0.75`` is the paper's ``p=0.75``.
        weight_init: ``"kaiming_normal"`` (default) or ``"signed_constant"`` frozen weights.
        weight_seed: seed of the frozen weights (each layer mixes in a CRC of its name) and of the Q/K/V masks;
            the "weight seed" the paper averages over.
        save_scores: also save the fp32 scores and weights (to resume training). Default ``False``: a checkpoint
            holds only the mask bits and one α per layer and loads for inference.
        attention: ``None``, ``"step_t"`` (single-step forecasting / anomaly detection: earlier steps attend to
            themselves, the last step to every earlier step) or ``"qkv_mask"`` (fixed random masks on the Q/K/V
            activations, classification). Needs attention that dispatches through transformers'
            ``AttentionInterface`` (PatchTST, Informer's canonical attention).
        attention_keep_ratio: ``qkv_mask``: fraction of activations kept (the paper's ``p_a``); ``None`` =
            ``keep_ratio``.
        attention_length: ``qkv_mask``: the sequence length the masks cover; ``None`` derives it from the model
            config where it can (PatchTST: number of patches).
        attention_modules: filled by ``apply_compression``: the attention modules the option applies to.
        init: ``"random"`` (the paper's: frozen weights and scores drawn from ``weight_seed``) or ``"dense"``: the
            frozen magnitudes are the dense weights' and the first mask keeps the largest weights whose sign the
            seed's signs agree with (the signs always come from the seed), so the layer starts near what it replaced.
        bias: keep the replaced Linear's bias (fp32, trained); SBT's layers have none.
    """

    method: str = "biprop"
    keep_ratio: float = 0.5
    weight_init: str = one_of("kaiming_normal", WEIGHT_INITS)
    weight_seed: int = 0
    save_scores: bool = False
    attention: str | None = one_of(None, ATTENTION_OPTIONS)
    attention_keep_ratio: float | None = None
    attention_length: int | None = None
    attention_modules: list[str] = field(default_factory=list)
    init: str = "random"  # not a one_of: --init is one flag of several methods, each with its own values
    bias: bool = False

    method_name: ClassVar[str] = "biprop"
    #: Version-1 dicts held every method's fields: their ``init`` was cp/svd's (``"decompose"``), not this one.
    version_1_foreign: ClassVar[tuple[str, ...]] = ("init",)

    def validate(self) -> None:
        super().validate()
        meaning = "the fraction of weights (activations) KEPT, e.g. 0.5 (the paper's prune rate p is this number)"
        check_fraction(self.keep_ratio, "keep_ratio", meaning)
        if self.attention_keep_ratio is not None:
            check_fraction(self.attention_keep_ratio, "attention_keep_ratio", meaning)
        check_choice(self.weight_init, "weight_init", WEIGHT_INITS)
        if self.init not in BIPROP_INITS:
            raise ValueError(
                f"init={self.init!r}: biprop's signs always come from weight_seed, so init is 'random' (frozen "
                "magnitudes and scores drawn too) or 'dense' (magnitudes and first mask from the dense weights); "
                "'decompose' computes cp/svd factors"
            )
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be True or False, got {self.bias!r}")
        check_int(self.weight_seed, "weight_seed", 0)
        if not isinstance(self.save_scores, bool):
            raise ValueError(f"save_scores must be True or False, got {self.save_scores!r}")
        if self.attention is not None:
            check_choice(self.attention, "attention", ATTENTION_OPTIONS)
        if self.attention_length is not None:
            check_int(self.attention_length, "attention_length", 1, " or None")
