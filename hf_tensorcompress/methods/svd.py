"""``method="svd"``: attention projections become ``U Vᵀ`` (the paper's "SVD-Smartformer" baseline)."""

from __future__ import annotations

from torch import nn

from ..config import CompressionConfig
from ..layers.lowrank import LowRankLinear, truncated_svd
from ..targets import attention_projections
from . import Method, register_method
from .ranks import resolve_rank


def build(model: nn.Module, name: str, linear: nn.Linear, config: CompressionConfig) -> LowRankLinear:
    fan_in, fan_out = linear.in_features, linear.out_features
    rank = resolve_rank(config.rank_for(name), fan_in + fan_out, fan_in * fan_out, min(fan_in, fan_out), name)
    layer = LowRankLinear(fan_in, fan_out, rank, bias=linear.bias is not None)
    if config.init == "decompose":
        layer.load_factors(list(truncated_svd(linear.weight.detach(), rank)))
    if linear.bias is not None:
        layer.bias.data.copy_(linear.bias.detach())
    return layer.to(device=linear.weight.device, dtype=linear.weight.dtype)


register_method(Method("svd", attention_projections, build))
