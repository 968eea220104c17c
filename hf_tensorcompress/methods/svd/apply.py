"""``method="svd"``: attention projections become ``U Vᵀ`` (the paper's "SVD-Smartformer" baseline); registers it."""

from __future__ import annotations

from torch import nn

from ...core.ranks import resolve_rank
from ...core.registry import Method, register_method
from ...core.targets import attention_projections
from .config import SVDConfig
from .layer import LowRankLinear, truncated_svd


def build(model: nn.Module, name: str, linear: nn.Linear, config: SVDConfig, calibration: None = None) -> LowRankLinear:
    fan_in, fan_out = linear.in_features, linear.out_features
    rank = resolve_rank(config.rank_for(name), fan_in + fan_out, fan_in * fan_out, min(fan_in, fan_out), name)
    layer = LowRankLinear(fan_in, fan_out, rank, bias=linear.bias is not None)
    if config.init == "decompose":
        layer.load_factors(list(truncated_svd(linear.weight.detach(), rank)))
    layer = layer.to(device=linear.weight.device, dtype=linear.weight.dtype)
    if linear.bias is not None:  # after the move: the bias of a model on the meta device is meta too
        layer.bias.data.copy_(linear.bias.detach())
    return layer


def reads_weights(config: SVDConfig) -> bool:
    return config.init == "decompose"


register_method(Method("svd", SVDConfig, attention_projections, build, reads_weights=reads_weights))
