"""The arm catalogue of the cross-domain TensorSLM recipe: every way of spending an embedding budget (TT with
each dense-row prior, SVD, frequency rows, rows + SVD tail) at a target ratio, and the arms compared in bytes
(maintained quantization libraries, the tiered method's settings, TT with low-bit storage)."""

from __future__ import annotations

import torch

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.evaluation.quantized_embedding import QUANT_ARMS, quantize_embedding
from hf_tensorcompress.methods.tt.baselines import dense_rows_svd_tail, frequency_only, rows_for_budget, tail_rank_for
from hf_tensorcompress.methods.tt.calibration import exact_token_ids
from hf_tensorcompress.methods.tt.energy import apply_svd_embedding, svd_rank_for
from hf_tensorcompress.methods.tt.solver import balanced_shape

#: ``method="tiered"`` settings of the byte comparison (``--byte-arms``), from 2× to 12× smaller than bf16. Tokens
#: are tiered by id (BPE merge order: no domain in it) except in the ``size_ratio`` byte budgets
#: (``tiered-budget-*``: each row's width by how often the calibration text and the model's own text use its token ×
#: output-aware error; ``-no-model-text``: by the calibration counts alone; ``-text-seed<S>``: the model's own
#: text sampled with seed S, for the spread one sample leaves; ``-text16k-seed<S>``: 16,384 tokens of it, not 8,192;
#: ``-temperature<T>-seed<S>``: drawn at temperature T);
#: ``rounding="output"`` uses the calibration corpus's hidden-state covariance (half of it the model's own text's in
#: the budgets). ``rows16+svd``: dense (bf16) rows + output-aware SVD of the others, the README's 2× arm.
TIERED_ARMS: dict[str, dict] = {
    "tiered-int4": dict(tier_bits=[4], rounding="output"),
    "tiered-int4/int3-24k": dict(tier_tokens=[24000], tier_bits=[4, 3], rounding="output"),
    "tiered-int4/int3-20k": dict(tier_tokens=[20000], tier_bits=[4, 3], rounding="output"),
    "tiered-int4/int3-8k": dict(tier_tokens=[8192], tier_bits=[4, 3], rounding="output"),
    "tiered-int3": dict(tier_bits=[3], rounding="output"),
    "tiered-int4/int3g192-4k": dict(tier_tokens=[4096], tier_bits=[4, 3], tier_group_size=[64, 192], rounding="output"),
    "rows16+svd": dict(tier_tokens=[21866], tier_bits=[16, 0], low_rank=55, low_rank_bits=16, rounding="output"),
    "rows-int4+svd-16k": dict(tier_tokens=[16384], tier_bits=[4, 0], low_rank=128, rounding="output"),
    "rows-int4+svd-12k": dict(tier_tokens=[12288], tier_bits=[4, 0], low_rank=128, rounding="output"),
    "rows-int4+svd-6k": dict(tier_tokens=[6144], tier_bits=[4, 0], low_rank=64, rounding="output"),
    "tiered-codebook": dict(tier_bits=["codebook"], rounding="output"),
    "tiered-int4/codebook-2k": dict(tier_tokens=[2000], tier_bits=[4, "codebook"], rounding="output"),
    "tiered-budget-4x": dict(size_ratio=4, rounding="output"),
    "tiered-budget-6x": dict(size_ratio=6, rounding="output"),
    "tiered-budget-8x": dict(size_ratio=8, rounding="output"),
    "tiered-budget-10x": dict(size_ratio=10, rounding="output"),
    **{
        f"tiered-budget-{ratio}x-no-model-text": dict(size_ratio=ratio, rounding="output", model_text_tokens=0)
        for ratio in (4, 6, 8, 10)
    },
    **{  # the same budgets on other samples of the model's own text: the spread one sample leaves
        f"tiered-budget-{ratio}x-text-seed{seed}": dict(size_ratio=ratio, rounding="output", model_text_seed=seed)
        for ratio in (4, 6, 8)
        for seed in (1, 2)
    },
    **{  # twice the model's own text, three samples: how much the spread narrows
        f"tiered-budget-{ratio}x-text16k-seed{seed}": dict(
            size_ratio=ratio, rounding="output", model_text_seed=seed, model_text_tokens=16384
        )
        for ratio in (4, 6, 8)
        for seed in (0, 1, 2)
    },
    **{  # the temperature the model's own text is drawn at, three samples each
        f"tiered-budget-{ratio}x-temperature{temperature}-seed{seed}": dict(
            size_ratio=ratio, rounding="output", model_text_seed=seed, model_text_temperature=temperature
        )
        for ratio in (4, 6, 8)
        for temperature in (0.8, 1.0, 1.25, 1.5, 1.75, 2.0)
        for seed in (0, 1, 2)
    },
}

#: The ``tt-calib`` arm at 2× (ranks 1,1, output-aware basis, dense rows by calibration counts) with its trains, dense
#: rows and basis stored as low-bit codes (``tt_storage_bits``), compared in bytes (``--byte-arms``).
TT_BYTE_ARMS: dict[str, dict] = {
    "tt-calib-int8": dict(tt_storage_bits=8),
    "tt-calib-int4": dict(tt_storage_bits=4, tt_storage_group_size=64),
}
BYTE_ARMS = [*QUANT_ARMS, *TIERED_ARMS, *TT_BYTE_ARMS]


def train_parameters(hidden: int, ranks: list[int]) -> int:
    """``Σ_k r_{k-1} I_k r_k`` of one token's train of order 3 at ``ranks``."""
    shape, bounds = balanced_shape(hidden, 3), [1, *ranks, 1]
    return sum(bounds[k] * shape[k] * bounds[k + 1] for k in range(3))


def exact_for_ratio(vocab: int, hidden: int, ratio: float, ranks: list[int] = (1, 1)) -> int:
    """Dense rows that bring TT at ``ranks`` + output-aware basis (``d²``) to ``ratio``: trains of every token, the
    basis and the rows together fill ``V·d / ratio``."""
    budget = vocab * hidden / ratio - vocab * train_parameters(hidden, list(ranks)) - hidden * hidden
    if budget < 0:
        raise ValueError(f"ratio {ratio} is beyond TT ranks {list(ranks)} with an output-aware basis")
    return int(budget // hidden)


def tt_arm(prior: str, exact: int, ranks: list[int], storage: dict | None = None):
    """build(model, calibration) → parameters, or stored bytes with low-bit ``storage`` (``TT_BYTE_ARMS``)."""

    def build(model, calibration):
        config = CompressionConfig(
            method="tt",
            tt_order=3,
            tt_ranks=ranks,
            tt_basis="output",
            tt_exact_tokens=exact,
            tt_exact_prior=prior,
            tt_solver="eigh",
            **(storage or {}),
        )
        apply_compression(model, config, calibration=calibration)
        layer = model.get_input_embeddings()
        return layer.effective_parameters() if storage is None else layer.storage_bits() // 8

    return build


def byte_arms(names: list[str], vocab: int, hidden: int) -> list[tuple[str, bool, object]]:
    """(name, needs calibration, build(model, calibration) → stored bytes) of the quantization arms
    (``QUANT_ARMS``, maintained libraries), the tiered method's settings (``TIERED_ARMS``) and TT with low-bit
    storage (``TT_BYTE_ARMS``)."""
    runs = []
    for name in names:
        if name in QUANT_ARMS:
            runs.append((name, False, lambda model, _, arm=name: quantize_embedding(model, arm)))
            continue
        if name in TT_BYTE_ARMS:
            exact = exact_for_ratio(vocab, hidden, 2)
            runs.append((name, True, tt_arm("calibration", exact, [1, 1], TT_BYTE_ARMS[name])))
            continue
        config = CompressionConfig(method="tiered", **TIERED_ARMS[name])

        def build(model, calibration, config=config):
            apply_compression(model, config, calibration=calibration)
            return model.get_input_embeddings().storage_bits() // 8

        runs.append((name, config.needs_calibration(), build))
    return runs


def arms(vocab: int, hidden: int, ratio: float) -> list[tuple[str, bool, object]]:
    """(name, needs calibration, build(model, calibration) → parameters) at ``ratio``; the first sets the budget."""
    exact = exact_for_ratio(vocab, hidden, ratio)
    budget = vocab * train_parameters(hidden, [1, 1]) + hidden * hidden + exact * hidden
    keep, tail_rank = rows_for_budget(hidden, budget), tail_rank_for(vocab, hidden, exact, budget)

    def calibrated_rows(calibration, prior):
        return exact_token_ids(calibration.counts, exact, prior)

    runs = [
        ("tt-calib", True, tt_arm("calibration", exact, [1, 1])),
        ("tt-mixed", True, tt_arm("mixed", exact, [1, 1])),
        ("tt-id", True, tt_arm("token_id", exact, [1, 1])),
        ("svd", False, lambda model, _: apply_svd_embedding(model, svd_rank_for(vocab, hidden, budget))),
        ("freq-calib", True, lambda model, c: frequency_only(model, exact_token_ids(c.counts, keep))),
        ("freq-id", False, lambda model, _: frequency_only(model, torch.arange(keep))),
        (
            "rows+svd-calib",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "calibration"), tail_rank),
        ),
        (
            "rows+svd-output-calib",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "calibration"), tail_rank, c.covariance),
        ),
        (
            "rows+svd-output-id",
            True,
            lambda model, c: dense_rows_svd_tail(model, torch.arange(exact), tail_rank, c.covariance),
        ),
        (
            "rows+svd-output-mixed",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "mixed"), tail_rank, c.covariance),
        ),
    ]
    if vocab * hidden / ratio >= vocab * train_parameters(hidden, [3, 3]) + hidden * hidden:
        runs.insert(
            3, ("tt-r33-calib", True, tt_arm("calibration", exact_for_ratio(vocab, hidden, ratio, [3, 3]), [3, 3]))
        )
    if ratio == 2:

        def plain(model, _):
            apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=[5, 5], tt_solver="eigh"))
            return model.get_input_embeddings().effective_parameters()

        runs.append(("tt-plain", False, plain))
    return runs
