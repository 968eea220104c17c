"""``size_ratio``'s layer (build time only; not shipped): every width measured once (``budget.py``), rows allocated
within the bytes by how often text uses their tokens, the model's special and protected tokens at int8 or wider,
and the result checked on held-back text against the same bytes with every row weighed alike (``guard.py``)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..tt.calibration import TTCalibration
from .assemble import layer_class, with_slots
from .budget import CHUNK_VALUES, Width, choose, describe, fill_rows, measure_widths, token_weights, width_name
from .config import TieredConfig
from .guard import BudgetCheckWarning, compare, protected_rows, warn_if_short, worst_served
from .layer import TieredEmbedding
from .model_text import ModelText

#: Held-back calibration tokens below which that text is too short to score (the model's own sample still is).
SHORTEST_CHECK = 64


def allocation_layer(
    weight: torch.Tensor,
    widths: list[Width],
    choice: torch.Tensor,
    rounding: torch.Tensor | None,
    scale: float | None,
    tied: str | None,
) -> TieredEmbedding:
    """The layer storing row ``i`` at ``widths[choice[i]]``: tiers from widest to narrowest, each tier's tokens in
    id order (the order changes no value), rounded output-aware under ``rounding`` where given."""
    vocab, hidden = weight.shape
    ranked = sorted(range(len(widths)), key=lambda index: -widths[index].row_bytes)
    kept = [index for index in ranked if bool((choice == index).any())]
    members = [(choice == index).nonzero().squeeze(1) for index in kept]
    tiers = [{"rows": len(ids), **widths[index].tier} for index, ids in zip(kept, members)]
    layer = layer_class(scale)(vocab, hidden, tiers).to(weight.device)
    chunk = max(1, CHUNK_VALUES // hidden)
    for stored, index, ids in zip(layer.tiers, kept, members):
        width, ids = widths[index], ids.to(weight.device)
        for first in range(0, len(ids), chunk):
            fill_rows(stored, first, width.stored(weight, ids[first : first + chunk], rounding))
    layer = with_slots(layer, torch.cat(members).to(weight.device))
    if scale is not None:
        layer.embed_scale = scale
    layer.tied_output = tied
    return layer


def _allocate(
    weight: torch.Tensor, covariance: torch.Tensor, config: TieredConfig, weights: torch.Tensor, protected: torch.Tensor
) -> tuple[int, list[Width], torch.Tensor, list[Width]]:
    """(the bytes the rows may take, every width measured, the weighed allocation, the widths it indexes): the
    codebooks below ``NARROW_BITS`` are measured only where the others cannot meet the budget."""
    vocab, hidden = weight.shape
    dense_bytes, slot_bytes = vocab * hidden * 2, vocab * 4
    target = dense_bytes / config.size_ratio
    budget = int(target) - slot_bytes
    options = (config.rounding == "output", config.tier_group_size, config.codebook_dim, config.codebook_size)
    widths = measure_widths(weight, covariance, *options, narrow=False)
    choice, option = choose(weights, widths, budget, protected)
    if choice is None:
        widths = widths + measure_widths(weight, covariance, *options, narrow=True)
        choice, option = choose(weights, widths, budget, protected)
    if choice is None:
        cheapest = min(w.row_bytes * vocab + w.fixed_bytes for w in widths) + slot_bytes
        floor = f" with {int(protected.sum())} protected rows at int8" if protected.any() else ""
        raise ValueError(
            f"size_ratio={config.size_ratio} asks for {int(target):,} bytes, but the {vocab}×{hidden} embedding needs "
            f"at least {cheapest:,} (every row at one narrowest width + the 4-byte token→row map{floor}): at most "
            f"size_ratio={dense_bytes / cheapest:.2f} here"
        )
    return budget, widths, choice, option


def _check_bytes(layer: TieredEmbedding, config: TieredConfig) -> None:
    vocab, hidden = layer.num_embeddings, layer.embedding_dim
    target, stored = vocab * hidden * 2 / config.size_ratio, layer.storage_bits() // 8
    if abs(stored - target) > 0.01 * target:
        raise ValueError(
            f"size_ratio={config.size_ratio}: the allocation stores {stored:,} bytes, more than 1 % from the "
            f"{int(target):,} asked for ({describe(layer.tier_specs, stored, vocab * hidden * 2)})"
        )


@torch.no_grad()
def budget_tiers(
    model: nn.Module,
    embedding: nn.Module,
    weight: torch.Tensor,
    config: TieredConfig,
    calibration: TTCalibration,
    scale: float | None,
    tied: str | None,
    text: ModelText,
) -> TieredEmbedding:
    """The layer of ``size_ratio``. Rows are weighed by their calibration counts and (``text.tokens``) the model's
    own text's expected counts; the error metric is the tied head's hidden-state covariance over both, half each (an
    untied embedding is only looked up, and its rows' errors are plain squared errors). The held-back check
    (``guard.compare``) may keep the allocation with every row weighed alike instead, with a warning."""
    vocab, hidden = weight.shape
    weighs = text if text.tokens else None
    covariance = calibration.covariance if tied else torch.eye(hidden, dtype=torch.float64)
    if tied and weighs is not None:
        covariance = (covariance.double() + text.covariance.double().to(covariance.device)) / 2
    warn_if_short(int(calibration.counts.sum()), vocab)
    weights = token_weights(calibration.counts, weighs)
    print(
        f"size_ratio: rows weighed by {int(calibration.counts.sum()):,} calibration tokens"
        + (f" and {text.tokens:,} tokens of the model's own text (from token {text.start})" if weighs else "")
    )
    protected = protected_rows(model, vocab, config.protected_tokens)
    budget, widths, choice, option = _allocate(weight, covariance, config, weights, protected)
    rounding = covariance.float().to(weight.device) if config.rounding == "output" else None
    layer = allocation_layer(weight, option, choice, rounding, scale, tied)
    _check_bytes(layer, config)
    texts = {"model's own text": text.held_out}
    if calibration.held_out is not None and len(calibration.held_out) >= SHORTEST_CHECK:
        texts = {"calibration text": calibration.held_out[None], **texts}
    alike_choice, alike_option = choose(torch.ones(vocab), widths, budget, protected)
    alike = allocation_layer(weight, alike_option, alike_choice, rounding, scale, tied)
    check = compare(model, embedding, layer, alike, texts)
    errors = torch.stack([width.errors for width in option], 1).gather(1, choice[:, None]).squeeze(1)
    names = [width_name(option[index].tier) for index in choice.tolist()]
    check.worst_served = worst_served(errors, texts.values(), names)
    print(describe(layer.tier_specs, layer.storage_bits() // 8, vocab * hidden * 2))
    print(check.line())
    if check.kept != "weighed":
        worst = ", ".join(f"token {token} ({uses} uses, {width})" for token, uses, width in check.worst_served)
        warnings.warn(
            "size_ratio: the allocation weighed by the calibration text lost on held-back text to the same bytes with "
            f"every row weighed alike ({check.line()}); the layer keeps the rows weighed alike. Rows it served worst: "
            f"{worst}. Give more calibration text of the kind the model will serve, keep model_text_tokens > 0, and "
            "protect a chat model's template tokens (protected_tokens=template_tokens(tokenizer))",
            BudgetCheckWarning,
            stacklevel=2,
        )
        layer = alike
        print(describe(layer.tier_specs, layer.storage_bits() // 8, vocab * hidden * 2))
    layer.budget_check = check
    return layer.to(embedding.weight.dtype)
