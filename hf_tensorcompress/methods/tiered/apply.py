"""``method="tiered"``: the token embedding stored as tiers of low-bit rows (+ an optional low-rank part); registers
the method. Targets ``model.get_input_embeddings()``; a tied output layer reads the same stored rows."""

from __future__ import annotations

import torch
from torch import nn

from ...core.registry import Method
from ...runtime.lowbit import LowBitTensor
from ..tt.apply import embedding_scale, input_embedding_name, tied_output_name
from ..tt.calibration import TTCalibration, exact_token_ids
from .assemble import layer_class, with_slots
from .budget import store
from .budget_tiers import budget_tiers
from .config import TieredConfig
from .guard import CHECK_TOKENS, held_back
from .layer import TieredEmbedding
from .model_text import sample_model_text
from .rounding import low_rank_factors
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
    layer = layer_class(scale)(vocab, hidden, tiers, config.low_rank, config.low_rank_bits).to(weight.device)
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
            rounded = store(rows[start : start + tier["rows"]], tier, covariance)
            next(stored).load_state_dict(rounded.state_dict())
        start += tier["rows"]
    return with_slots(layer, order)


@torch.no_grad()
def build(
    model: nn.Module, name: str, embedding: nn.Embedding, config: TieredConfig, calibration: TTCalibration | None
) -> TieredEmbedding:
    scale = embedding_scale(name, embedding, "tiered")
    weight = embedding.weight.detach()
    tied = tied_output_name(model, embedding)
    if config.size_ratio is not None:
        text = sample_model_text(
            model,
            config.model_text_tokens,
            calibration.counts,
            seed=config.model_text_seed,
            held_tokens=CHECK_TOKENS,
            temperature=config.model_text_temperature,
        )
        return budget_tiers(model, embedding, weight, config, calibration, scale, tied, text)
    layer = fixed_tiers(weight.float(), config, calibration, scale)
    if scale is not None:
        layer.embed_scale = scale
    layer.tied_output = tied
    return layer.to(embedding.weight.dtype)


def calibrate(model: nn.Module, config: TieredConfig, ids: torch.Tensor, covariance_tokens: int) -> TTCalibration:
    """Calibration text: token counts for ``tier_order``, the hidden-state covariance for ``rounding=\"output\"``
    (``apply_tiered``)."""
    if config.size_ratio is None:
        return TTCalibration.from_ids(model, ids, covariance_tokens, config.rounding == "output", "apply_tiered")
    ids, held_out = held_back(ids) if isinstance(ids, torch.Tensor) else (ids, None)
    calibration = TTCalibration.from_ids(model, ids, covariance_tokens, True, "apply_tiered")
    calibration.held_out = held_out
    return calibration


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
