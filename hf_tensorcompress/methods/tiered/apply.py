"""``method="tiered"``: the token embedding stored as tiers of low-bit rows (+ an optional low-rank part); registers
the method. Targets ``model.get_input_embeddings()``; a tied output layer reads the same stored rows."""

from __future__ import annotations

import torch
from torch import nn

from ...core.registry import Method
from ...runtime.codebook import CodebookTensor
from ...runtime.lowbit import LowBitTensor
from ..tt.apply import input_embedding_name, tied_output_name
from ..tt.calibration import TTCalibration, exact_token_ids
from .codebook_rounding import codebook_codes
from .config import TieredConfig
from .layer import TieredEmbedding
from .rounding import low_rank_factors, output_aware_codes


def check_calibration(model: nn.Module, config: TieredConfig, calibration: object) -> TTCalibration | None:
    """``Method.prepare``: the calibration the config needs, else an error saying how to give it."""
    if not config.needs_calibration():
        return None
    if not isinstance(calibration, TTCalibration) or (config.rounding == "output" and calibration.covariance is None):
        raise ValueError(
            "method='tiered' with rounding='output' or tier_order other than 'token_id' needs calibration text: call "
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


@torch.no_grad()
def build(
    model: nn.Module, name: str, embedding: nn.Embedding, config: TieredConfig, calibration: TTCalibration | None
) -> TieredEmbedding:
    if type(embedding) is not nn.Embedding:
        raise ValueError(f"method 'tiered' replaces plain nn.Embedding modules; {name} is {type(embedding).__name__}")
    weight = embedding.weight.detach().float()
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
    layer = TieredEmbedding(vocab, hidden, tiers, config.low_rank, config.low_rank_bits).to(weight.device)
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
    slot = torch.empty(vocab, dtype=torch.int32, device=weight.device)
    slot[order] = torch.arange(vocab, dtype=torch.int32, device=weight.device)
    layer.slot.copy_(slot)
    layer.tied_output = tied_output_name(model, embedding)
    return layer.to(embedding.weight.dtype)


def calibrate(model: nn.Module, config: TieredConfig, ids: torch.Tensor, covariance_tokens: int) -> TTCalibration:
    """Calibration text: token counts for ``tier_order``, the hidden-state covariance for ``rounding=\"output\"``
    (``apply_tiered``)."""
    return TTCalibration.from_ids(model, ids, covariance_tokens, config.rounding == "output", "apply_tiered")


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "tiered",
    TieredConfig,
    lambda model: input_embedding_name(model, "tiered"),
    build,
    accepts=(nn.Embedding,),
    prepare=check_calibration,
    calibrate=calibrate,
    layers=(TieredEmbedding,),
)
