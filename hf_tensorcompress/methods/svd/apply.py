"""``method="svd"``: attention projections become ``U Vᵀ`` (the paper's "SVD-Smartformer" baseline); registers it."""

from __future__ import annotations

from torch import nn

from ...core.ranks import resolve_rank
from ...core.registry import Method
from ...core.targets import attention_projections, dense_projection, projection_types
from .config import SVDConfig
from .layer import LowRankLinear, truncated_svd


def build(model: nn.Module, name: str, linear: nn.Linear, config: SVDConfig, calibration: None = None) -> LowRankLinear:
    dense = dense_projection(linear)
    fan_in, fan_out = dense.in_features, dense.out_features
    rank = resolve_rank(config.rank_for(name), fan_in + fan_out, fan_in * fan_out, min(fan_in, fan_out), name)
    layer = LowRankLinear(
        fan_in,
        fan_out,
        rank,
        bias=dense.bias is not None,
        factor_bits=config.factor_bits,
        factor_group_size=config.factor_group_size,
    )
    if config.init == "decompose":
        layer.load_factors(list(truncated_svd(dense.weight, rank)))
    layer = layer.to(device=dense.weight.device, dtype=dense.weight.dtype)
    if dense.bias is not None:  # after the move: the bias of a model on the meta device is meta too
        layer.bias.data.copy_(dense.bias)
    return layer


def reads_weights(config: SVDConfig) -> bool:
    return config.init == "decompose"


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "svd",
    SVDConfig,
    attention_projections,
    build,
    accepts=projection_types(),
    reads_weights=reads_weights,
    layers=(LowRankLinear,),
)
