"""``method="lowbit"``: every target Linear keeps its full weight in a few bits, trained quantization-aware."""

from __future__ import annotations

import logging

import torch
from torch import nn

from ...core.registry import Method
from ...core.targets import dense_projection, projection_types
from .config import LowBitConfig
from .layer import LowBitLinear

LOGGER = logging.getLogger(__name__)


def all_linear(model: nn.Module) -> list[str]:
    """Every ``nn.Linear`` (and GPT-2 ``Conv1D``) of the model but its output embeddings (a language model's head,
    often tied to the token embedding, which these layers would untie)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = projection_types()
    return [name for name, module in model.named_modules() if isinstance(module, kinds) and module is not head]


def rotation_block(name: str, in_features: int, config: LowBitConfig) -> int | None:
    """The block a Linear's inputs rotate in (``None``: not rotated); a warning where the option asks for a rotation
    the Linear's inputs cannot take."""
    if config.input_rotation == "none":
        return None
    if in_features % config.rotation_block:
        LOGGER.warning(
            "input_rotation=%r: %s has %d inputs, not a multiple of rotation_block=%d; left unrotated",
            config.input_rotation,
            name,
            in_features,
            config.rotation_block,
        )
        return None
    return config.rotation_block


def build(
    model: nn.Module, name: str, linear: nn.Module, config: LowBitConfig, calibration: None = None
) -> LowBitLinear:
    dense = dense_projection(linear)
    layer = LowBitLinear(
        dense.in_features,
        dense.out_features,
        config.weight_bits,
        config.weight_group_size,
        bias=dense.bias is not None,
        learned_scales=config.weight_scales == "learned",
        half_bias=config.bias_dtype == "float16",
        rotation_block=rotation_block(name, dense.in_features, config),
        rotation_seed=config.rotation_seed if config.input_rotation == "randomized-hadamard" else None,
    )
    layer = layer.to(device=dense.weight.device, dtype=dense.weight.dtype)
    if config.init == "copy":
        with torch.no_grad():  # a rotated layer holds the weight in its rotated basis (computed in fp32)
            weight = dense.weight if layer.rotation is None else layer.rotation.rotate(dense.weight.float())
            layer.latent.copy_(weight)
        layer.start_scales()  # from the copied weights
    if dense.bias is not None:  # after the move: the bias of a model on the meta device is meta too
        layer.bias.data.copy_(dense.bias)
    return layer


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "lowbit",
    LowBitConfig,
    all_linear,
    build,
    accepts=projection_types(),
    keywords={"all-linear": all_linear},
    reads_weights=lambda config: config.init == "copy",
    layers=(LowBitLinear,),
)
