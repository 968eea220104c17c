"""Options of ``method="tiered"`` (tiered low-bit token embeddings)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ...config import CompressionConfig, check_choice, check_int, one_of
from ..tt.config import EXACT_PRIORS

#: Widths a tier may store (0: nothing but the low-rank part; 16: bfloat16 rows; "codebook": vector-quantized rows,
#: ``codebook_dim`` columns per index into ``codebook_size`` shared vectors).
TIER_BITS = (0, 2, 3, 4, 8, 16, "codebook")

#: Codebook sizes a ``"codebook"`` tier stores (``runtime/codebook.py``: an index is a byte plus 0, 2, 3, 4 or 8 packed
#: high bits); kept here because config modules import no torch.
CODEBOOK_SIZES = (256, 1024, 2048, 4096, 65536)

#: How codes are chosen: round-to-nearest, or output-aware (GPTQ with the calibration covariance).
ROUNDINGS = ("nearest", "output")

#: Widths a ``size_ratio`` budget chooses among, row by row (``"codebook"``: ``codebook_dim`` × ``codebook_size``).
BUDGET_WIDTHS = (2, 3, 4, 8, 16, "codebook")

#: The further codebooks a ``size_ratio`` budget chooses among, as (``codebook_dim``, ``codebook_size``): below the
#: 2.5 bits a weight of int2 with group scales or of the default codebook, 2 bits (4-vectors, 256 entries), 1.5 bits
#: (8-vectors, 4,096 entries) and 1 bit (8-vectors, 256 entries), each table fitted once and shared by its rows.
BUDGET_CODEBOOKS = ((4, 256), (8, 4096), (8, 256))

#: Widths the low-rank factors are stored at.
LOW_RANK_BITS = (8, 16)


def _int_list(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _width_list(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(_int_list([v]) or v == "codebook" for v in value)


@dataclass
class TieredConfig(CompressionConfig):
    """The token embedding (and a tied output layer) stored as tiers of low-bit rows, training-free.

    Args:
        size_ratio: a byte budget: the layer is this many times smaller than the bf16 matrix, every stored byte
            counted (codes, scales, codebook, the token→row map), within 1 %. Each token's row gets its own width
            (one of ``BUDGET_WIDTHS`` or the codebooks of ``BUDGET_CODEBOOKS``, 1 to 16 bits a weight) by measured
            sensitivity: how often the token is used (its calibration count, its expected count in the model's own
            text of ``model_text_tokens``, plus one) times the output-aware error of its row at that width, allocated
            greedily (Lagrangian) — nothing depends on how the tokenizer numbers its tokens. Needs calibration text
            (``apply_tiered``); leave ``tier_tokens``, ``tier_bits`` and ``low_rank`` unset. The allocation is the
            layer's tiers (saved in its spec).
        tier_tokens: how many tokens each tier but the last holds, in ``tier_order``; the last tier takes the rest.
        tier_bits: one width per tier (``len(tier_tokens) + 1``): 2, 3, 4, 8 (packed integer codes with an fp16
            scale and minimum per group), 16 (bfloat16 rows), ``"codebook"`` (vector quantization: every
            ``codebook_dim`` columns one index into ``codebook_size`` shared vectors, an fp16 scale per row; 2.5 bits
            a weight at the defaults) or 0 (last tier only: rows are the low-rank part alone, i.e. dense rows + an
            SVD tail).
        tier_group_size: columns sharing a scale, one int for every tier or one per tier; None: one group per row.
        tier_order: which tokens come first: ``"token_id"`` (lowest ids: BPE merge order, no text needed),
            ``"calibration"`` (most frequent in the calibration text) or ``"mixed"`` (half each). ``"token_id"`` and
            ``"mixed"`` depend on how the tokenizer numbers its tokens (so do ties among unseen tokens under
            ``"calibration"``): the same setting lands elsewhere on another vocabulary; ``size_ratio`` does not.
        rounding: ``"nearest"`` (round-to-nearest) or ``"output"`` (GPTQ rounding under the covariance of the hidden
            states the tied output layer sees: minimises the expected logit error; needs calibration text).
        low_rank: rank of a part ``left @ right`` added to the last tier's rows (0: none),
            fitted in the output metric when ``rounding="output"``; with quantized tiers it is fitted first and the
            quantization stores what it leaves.
        low_rank_bits: the width the two factors are stored at (8 or 16).
        codebook_dim: columns per codebook index in ``"codebook"`` tiers.
        codebook_size: entries of each ``"codebook"`` tier's codebook (one of ``CODEBOOK_SIZES``).
        model_text_tokens: with ``size_ratio``, how many tokens the model samples from its start token (its BOS) to
            weigh rows beside the calibration text: their expected counts count as much as the calibration text,
            and their hidden states make half the output-aware covariance, so tokens one calibration text never
            uses keep the rows other text needs (0: the calibration text alone).
        model_text_seed: the seed of that sample (a build is reproducible; other seeds show how much the
            allocation's quality depends on the one sample drawn).
        model_text_temperature: the temperature that text is drawn at (the build's check draws its own at 1); the
            counts are the model's probabilities at temperature 1 wherever the draws lead. Drawn at 1, a sequence
            settles into one kind of text; drawn hotter, the sequences reach more kinds, so rows other text needs
            are weighed too. The default was chosen on text no published table scores (SmolLM2 at 8×, 0.8 to 2
            tried); at 2 the text turned to noise and the build lost about twice as much.
        protected_tokens: with ``size_ratio``, token ids whose rows are never stored narrower than int8, beside the
            ones always protected: the start, end and padding tokens of the model's config and generation config.
            Chat models read tokens prose never contains (``<|im_start|>``, role names, the template's separators):
            ``hf_tensorcompress.template_tokens(tokenizer)`` lists the special tokens and those a chat template
            writes, and the command line adds them from the model's tokenizer.
    """

    method: str = "tiered"
    size_ratio: float | None = None
    tier_tokens: list[int] | None = None
    tier_bits: list[int] | None = one_of(None, TIER_BITS)
    tier_group_size: int | list[int | None] | None = 64
    tier_order: str = one_of("token_id", EXACT_PRIORS)
    rounding: str = one_of("nearest", ROUNDINGS)
    low_rank: int = 0
    low_rank_bits: int = one_of(8, LOW_RANK_BITS)
    codebook_dim: int = 4
    codebook_size: int = one_of(1024, CODEBOOK_SIZES)
    model_text_tokens: int = 8192
    model_text_seed: int = 0
    model_text_temperature: float = 1.5
    protected_tokens: list[int] | None = None

    method_name: ClassVar[str] = "tiered"

    def validate(self) -> None:
        super().validate()
        if self.size_ratio is not None:
            self._validate_budget()
        for name in ("tier_tokens", "tier_bits"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (list, tuple)):
                raise ValueError(f"{name} must be a list of ints (one per tier) or None, got {value!r}")
        self.tier_tokens = list(self.tier_tokens or [])
        if self.size_ratio is not None:
            return
        if self.protected_tokens:
            raise ValueError(
                "protected_tokens is a floor of the size_ratio budget; fixed tiers store every row as tier_bits says "
                "(put those tokens in a wide tier with tier_order, or use size_ratio)"
            )
        self.tier_bits = list(self.tier_bits) if self.tier_bits is not None else [4] * (len(self.tier_tokens) + 1)
        if not _int_list(self.tier_tokens) or any(v < 1 for v in self.tier_tokens):
            raise ValueError(f"tier_tokens must be a list of ints >= 1 (tokens per tier), got {self.tier_tokens!r}")
        if not _width_list(self.tier_bits) or len(self.tier_bits) != len(self.tier_tokens) + 1:
            raise ValueError(
                f"tier_bits={self.tier_bits!r} needs one width per tier: {len(self.tier_tokens) + 1} ints or "
                f'"codebook" (tier_tokens={self.tier_tokens} plus the last tier holding the rest)'
            )
        for bits in self.tier_bits:
            check_choice(bits, "tier_bits entries", TIER_BITS)
        if 0 in self.tier_bits[:-1] or (self.tier_bits[-1] == 0 and not self.low_rank):
            raise ValueError("tier_bits=0 (rows from the low-rank part alone) is for the last tier and needs low_rank")
        groups = self.tier_group_size if isinstance(self.tier_group_size, list) else [self.tier_group_size]
        if len(groups) not in (1, len(self.tier_bits)) or any(
            g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1) for g in groups
        ):
            raise ValueError(
                f"tier_group_size must be an int >= 1, None (one group per row) or one of those per tier, got "
                f"{self.tier_group_size!r}"
            )
        check_choice(self.tier_order, "tier_order", EXACT_PRIORS)
        check_choice(self.rounding, "rounding", ROUNDINGS)
        check_int(self.low_rank, "low_rank", 0, " (0: no low-rank part)")
        check_int(self.low_rank_bits, "low_rank_bits", 8, " (8 or 16)")  # 8.0 == 8 passes check_choice alone
        check_choice(self.low_rank_bits, "low_rank_bits", LOW_RANK_BITS)
        check_int(self.codebook_dim, "codebook_dim", 1, " (columns per codebook index)")
        check_int(self.codebook_size, "codebook_size", 1, f" (one of {list(CODEBOOK_SIZES)})")
        check_choice(self.codebook_size, "codebook_size", CODEBOOK_SIZES)

    def _validate_budget(self) -> None:
        ratio = self.size_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 1:
            raise ValueError(f"size_ratio must be a number > 1 (times smaller than bf16), got {ratio!r}")
        if self.tier_tokens or self.tier_bits is not None or self.low_rank:
            raise ValueError(
                "size_ratio chooses every row's width itself: leave tier_tokens, tier_bits and low_rank unset "
                f"(got tier_tokens={self.tier_tokens!r}, tier_bits={self.tier_bits!r}, low_rank={self.low_rank!r})"
            )
        if not isinstance(self.tier_group_size, int) or isinstance(self.tier_group_size, bool):
            raise ValueError(f"with size_ratio, tier_group_size must be one int, got {self.tier_group_size!r}")
        check_int(self.model_text_tokens, "model_text_tokens", 0, " (tokens of the model's own text; 0: none)")
        check_int(self.model_text_seed, "model_text_seed", 0, " (the seed of the model's own text)")
        temperature = self.model_text_temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
            raise ValueError(
                f"model_text_temperature must be a number > 0 (the temperature the model's own text is drawn at; 1: "
                f"its own distribution), got {temperature!r}"
            )
        tokens = self.protected_tokens
        if tokens is not None and (not _int_list(tokens) or any(token < 0 for token in tokens)):
            raise ValueError(f"protected_tokens must be a list of token ids (ints >= 0) or None, got {tokens!r}")

    def group_sizes(self) -> list[int | None]:
        """One group size per tier."""
        groups = self.tier_group_size if isinstance(self.tier_group_size, list) else [self.tier_group_size]
        return groups * len(self.tier_bits) if len(groups) == 1 else list(groups)

    def needs_calibration(self) -> bool:
        return self.size_ratio is not None or self.rounding == "output" or self.tier_order != "token_id"
