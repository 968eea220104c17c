"""``method="tiered"``: the token embedding stored as tiers of low-bit rows (+ an optional low-rank part); registers
the method. Targets ``model.get_input_embeddings()``; a tied output layer reads the same stored rows."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ...core.registry import Method
from ...runtime.codebook import CodebookTensor
from ...runtime.lowbit import LowBitTensor
from ..tt.apply import embedding_scale, input_embedding_name, tied_output_name
from ..tt.calibration import TTCalibration, exact_token_ids
from .budget import choose, describe, measure_widths, subset, token_weights
from .codebook_rounding import codebook_codes
from .config import TieredConfig
from .layer import TieredEmbedding
from .model_text import ModelText, sample_model_text
from .rounding import low_rank_factors, output_aware_codes
from .scaled import ScaledTieredEmbedding


def check_calibration(model: nn.Module, config: TieredConfig, calibration: object) -> TTCalibration | None:
    """``Method.prepare``: the calibration the config needs, else an error saying how to give it."""
    if not config.needs_calibration():
        return None
    needs_covariance = config.rounding == "output" or config.size_ratio is not None
    if not isinstance(calibration, TTCalibration) or (needs_covariance and calibration.covariance is None):
        raise ValueError(
            "method='tiered' with size_ratio, rounding='output' or tier_order other than 'token_id' needs calibration "
            "text (size_ratio measures each token's sensitivity on it): call "
            "apply_tiered(model, config, calibration_ids) with token ids of text the model should serve, or pass "
            "calibration=TTCalibration(counts, hidden_covariance(model, ids)) to apply_compression"
        )
    return calibration


def _store(rows: torch.Tensor, tier: dict, covariance: torch.Tensor | None) -> LowBitTensor | CodebookTensor:
    if tier["bits"] == "codebook":
        return codebook_codes(rows, tier["codebook_dim"], tier["codebook_size"], covariance)
    if covariance is not None and tier["bits"] != 16:
        return output_aware_codes(rows, covariance, tier["bits"], tier["group_size"])
    return LowBitTensor.quantize(rows, tier["bits"], tier["group_size"])


def _layer_class(scale: float | None) -> type[TieredEmbedding]:
    return TieredEmbedding if scale is None else ScaledTieredEmbedding


@torch.no_grad()
def fixed_tiers(
    weight: torch.Tensor, config: TieredConfig, calibration: TTCalibration | None, scale: float | None
) -> TieredEmbedding:
    """The layer of the fixed-tier options: ``tier_tokens`` tokens per tier in ``tier_order``, ``tier_bits`` each."""
    vocab, hidden = weight.shape
    if sum(config.tier_tokens) >= vocab:
        raise ValueError(
            f"tier_tokens={config.tier_tokens} leave no token for the last tier of a {vocab}-token vocabulary"
        )
    counts = calibration.counts if calibration is not None else torch.zeros(vocab, dtype=torch.long)
    order = exact_token_ids(counts, vocab, config.tier_order).to(weight.device)
    covariance = calibration.covariance if config.rounding == "output" else None
    sizes = [*config.tier_tokens, vocab - sum(config.tier_tokens)]
    codebook = {"codebook_dim": config.codebook_dim, "codebook_size": config.codebook_size}
    tiers = [
        {"rows": n, "bits": b, "group_size": g if b not in (0, 16, "codebook") else None}
        | (codebook if b == "codebook" else {})
        for n, b, g in zip(sizes, config.tier_bits, config.group_sizes())
    ]
    layer = _layer_class(scale)(vocab, hidden, tiers, config.low_rank, config.low_rank_bits).to(weight.device)
    rows = weight[order]
    if config.low_rank:
        left, right = low_rank_factors(rows[layer.low_rank_start :], config.low_rank, covariance)
        layer.left.load_state_dict(LowBitTensor.quantize(left, config.low_rank_bits).state_dict())
        layer.right.load_state_dict(LowBitTensor.quantize(right, config.low_rank_bits).state_dict())
        rows = rows.clone()
        rows[layer.low_rank_start :] -= layer.left.dequantize() @ layer.right.dequantize()
    stored, start = iter(layer.tiers), 0
    for tier in tiers:
        if tier["bits"]:
            rounded = _store(rows[start : start + tier["rows"]], tier, covariance)
            next(stored).load_state_dict(rounded.state_dict())
        start += tier["rows"]
    return _with_slots(layer, order)


def _with_slots(layer: TieredEmbedding, order: torch.Tensor) -> TieredEmbedding:
    """``order[i]`` is the token stored in row ``i``; the layer's ``slot`` maps tokens back to rows."""
    slot = torch.empty(len(order), dtype=torch.int32, device=order.device)
    slot[order] = torch.arange(len(order), dtype=torch.int32, device=order.device)
    layer.slot.copy_(slot)
    return layer


@torch.no_grad()
def budget_tiers(
    weight: torch.Tensor,
    config: TieredConfig,
    calibration: TTCalibration,
    scale: float | None,
    tied: bool,
    text: ModelText | None,
) -> TieredEmbedding:
    """The layer of ``size_ratio``: each row's width chosen by measured sensitivity within the byte budget
    (``budget.py``); tiers from widest to narrowest, each tier's tokens in id order (the order changes no value).
    The error metric is the tied head's hidden-state covariance, over the calibration text and (``text``) the
    model's own text, half each; an embedding that is only looked up (untied head) has no such metric, and its rows'
    errors are plain squared errors."""
    vocab, hidden = weight.shape
    covariance = calibration.covariance if tied else torch.eye(hidden, dtype=torch.float64)
    if tied and text is not None:
        covariance = (covariance.double() + text.covariance.double().to(covariance.device)) / 2
    weights = token_weights(calibration.counts, text)
    print(
        f"size_ratio: rows weighed by {int(calibration.counts.sum()):,} calibration tokens"
        + (f" and {text.tokens:,} tokens of the model's own text (from token {text.start})" if text else "")
    )
    dense_bytes = vocab * hidden * 2
    slot_bytes = vocab * 4
    measure = partial(
        measure_widths,
        weight,
        covariance,
        config.rounding == "output",
        config.tier_group_size,
        config.codebook_dim,
        config.codebook_size,
    )
    target = dense_bytes / config.size_ratio
    budget = int(target) - slot_bytes
    widths = measure(narrow=False)
    choice, widths = choose(weights, widths, budget)
    if choice is None:
        widths = widths + measure(narrow=True)
        choice, widths = choose(weights, widths, budget)
    if choice is None:
        cheapest = min(w.row_bytes * vocab + w.fixed_bytes for w in widths) + slot_bytes
        raise ValueError(
            f"size_ratio={config.size_ratio} asks for {int(target):,} bytes, but the {vocab}×{hidden} embedding needs "
            f"at least {cheapest:,} (every row at one narrowest width + the 4-byte token→row map): at most "
            f"size_ratio={dense_bytes / cheapest:.2f} here"
        )
    ranked = sorted(range(len(widths)), key=lambda index: -widths[index].row_bytes)
    kept = [index for index in ranked if bool((choice == index).any())]
    members = [(choice == index).nonzero().squeeze(1) for index in kept]
    tiers = [{"rows": len(ids), **widths[index].tier} for index, ids in zip(kept, members)]
    layer = _layer_class(scale)(vocab, hidden, tiers).to(weight.device)
    for stored, index, ids in zip(layer.tiers, kept, members):
        stored.load_state_dict(subset(widths[index], ids).state_dict())
    layer = _with_slots(layer, torch.cat(members).to(weight.device))
    stored_bytes = layer.storage_bits() // 8
    if abs(stored_bytes - target) > 0.01 * target:
        raise ValueError(
            f"size_ratio={config.size_ratio}: the allocation stores {stored_bytes:,} bytes, more than 1 % from the "
            f"{int(target):,} asked for ({describe(tiers, stored_bytes, dense_bytes)})"
        )
    print(describe(tiers, stored_bytes, dense_bytes))
    return layer


@torch.no_grad()
def build(
    model: nn.Module, name: str, embedding: nn.Embedding, config: TieredConfig, calibration: TTCalibration | None
) -> TieredEmbedding:
    scale = embedding_scale(name, embedding, "tiered")
    weight = embedding.weight.detach().float()
    tied = tied_output_name(model, embedding)
    if config.size_ratio is not None:
        tokens, counts = config.model_text_tokens, calibration.counts
        text = sample_model_text(model, tokens, counts) if tokens else None
        layer = budget_tiers(weight, config, calibration, scale, tied is not None, text)
    else:
        layer = fixed_tiers(weight, config, calibration, scale)
    if scale is not None:
        layer.embed_scale = scale
    layer.tied_output = tied
    return layer.to(embedding.weight.dtype)


def calibrate(model: nn.Module, config: TieredConfig, ids: torch.Tensor, covariance_tokens: int) -> TTCalibration:
    """Calibration text: token counts for ``tier_order``, the hidden-state covariance for ``rounding=\"output\"``
    (``apply_tiered``)."""
    covariance = config.rounding == "output" or config.size_ratio is not None
    return TTCalibration.from_ids(model, ids, covariance_tokens, covariance, "apply_tiered")


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "tiered",
    TieredConfig,
    lambda model: input_embedding_name(model, "tiered"),
    build,
    accepts=(nn.Embedding,),
    prepare=check_calibration,
    calibrate=calibrate,
    layers=(TieredEmbedding, ScaledTieredEmbedding),
)
