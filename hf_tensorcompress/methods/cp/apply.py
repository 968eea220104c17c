"""``method="cp"``: attention projections become CP factors (Smartformer's CPAC-Attention); registers the method."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ...core.ranks import resolve_rank
from ...core.registry import Method
from ...core.targets import DenseProjection, attention_projections, dense_projection, parent_of, projection_types
from .config import CPConfig
from .layer import CPLinear


def heads_of(model: nn.Module, name: str, in_features: int) -> int:
    """Heads of the attention module holding ``name`` (its ``num_heads``, else the model config's
    ``num_attention_heads``) when they divide the input; elsewhere a balanced split of ``in_features``."""
    parent_config = getattr(parent_of(model, name), "config", None)
    for heads in (
        getattr(parent_of(model, name), "num_heads", None),
        getattr(parent_config, "num_attention_heads", None),
        getattr(getattr(model, "config", None), "num_attention_heads", None),
    ):
        if isinstance(heads, int) and heads > 0 and in_features % heads == 0:
            return heads
    return max(d for d in range(1, math.isqrt(in_features) + 1) if in_features % d == 0)


def cp_rank(model: nn.Module, name: str, dense: DenseProjection, requested: int | float) -> tuple[int, int]:
    """(heads, rank) for the projection ``dense`` given a requested int rank or parameter ratio."""
    heads = heads_of(model, name, dense.in_features)
    head_dim, out = dense.in_features // heads, dense.out_features
    max_rank = min(heads * head_dim, heads * out, head_dim * out)
    rank = resolve_rank(requested, heads + head_dim + out, dense.in_features * out, max_rank, name)
    return heads, rank


def decompose(tensor: torch.Tensor, rank: int, iterations: int) -> list[torch.Tensor]:
    """CP-ALS of a 3-way tensor with tensorly's ``parafac`` on its PyTorch backend (SVD init).

    When the rank exceeds a mode size tensorly pads the SVD init with random columns, drawn from numpy's global
    generator unless told otherwise; a fixed ``random_state`` makes the same weights give the same factors
    whatever ran before (seen: one recipe seed's test MSE moved 0.85 → 0.92 with the order of its runs)."""
    import tensorly as tl  # imported here: only the initial decomposition needs it
    from tensorly.decomposition import parafac

    with tl.backend_context("pytorch"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tensorly warns when the rank exceeds a mode size and pads the SVD init
        _, factors = parafac(tensor.double(), rank=rank, init="svd", n_iter_max=iterations, tol=1e-10, random_state=0)
    return factors


def build(model: nn.Module, name: str, linear: nn.Linear, config: CPConfig, calibration: None = None) -> CPLinear:
    dense = dense_projection(linear)
    heads, rank = cp_rank(model, name, dense, config.rank_for(name))
    weight = dense.weight
    layer = CPLinear(
        dense.in_features,
        dense.out_features,
        heads,
        rank,
        bias=dense.bias is not None,
        factor_bits=config.factor_bits,
        factor_group_size=config.factor_group_size,
    )
    if config.init == "decompose":
        layer.load_factors(decompose(layer.folded_weight(weight), rank, config.cp_iterations))
    layer = layer.to(device=weight.device, dtype=weight.dtype)
    if dense.bias is not None:  # after the move: the bias of a model on the meta device is meta too
        layer.bias.data.copy_(dense.bias)
    return layer


def reads_weights(config: CPConfig) -> bool:
    return config.init == "decompose"


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "cp",
    CPConfig,
    attention_projections,
    build,
    accepts=projection_types(),
    reads_weights=reads_weights,
    layers=(CPLinear,),
)
