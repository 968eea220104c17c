"""``method="biprop"``: Sparse Binary Transformers (frozen random weights, learned masks, ``α·sign``); registers it."""

from __future__ import annotations

import zlib

import torch
from torch import nn

from ...core.registry import Method
from ...core.targets import attention_projections, dense_projection, family_of, projection_types
from .attention import SBTAttention, install_attention
from .config import BipropConfig
from .layer import BipropLinear

#: Attention classes that dispatch through transformers' ``AttentionInterface`` (so the SBT options can hook in).
INTERFACE_ATTENTION = ("PatchTSTAttention", "InformerAttention")


def default_targets(model: nn.Module) -> list[str]:
    """q/k/v and the attention output projection: the attention modules' own projections."""
    return attention_projections(model, with_output=True)


def encoder_name(model: nn.Module) -> str:
    """Full name of the model's (outermost) encoder module."""
    family_of(model)
    names = [name for name, _ in model.named_modules() if name.rpartition(".")[2] == "encoder"]
    if not names:
        raise ValueError(f"{type(model).__name__} has no module named 'encoder'; pass target_modules explicitly")
    return min(names, key=len)


def encoder_linears(model: nn.Module) -> list[str]:
    """``target_modules="all-linear"``: every ``nn.Linear`` of the encoder, as the paper binarizes them all."""
    prefix = encoder_name(model) + "."
    return [name for name, module in model.named_modules() if name.startswith(prefix) and isinstance(module, nn.Linear)]


def sign_seed(weight_seed: int, name: str) -> int:
    """A per-layer seed: the config's weight seed mixed with a CRC of the module name (stable across runs)."""
    return (weight_seed * 1_000_003 + zlib.crc32(name.encode())) & 0xFFFFFFFF


def build(
    model: nn.Module, name: str, linear: nn.Linear, config: BipropConfig, calibration: None = None
) -> BipropLinear:
    seed = sign_seed(config.weight_seed, name)
    dense = dense_projection(linear)
    layer = BipropLinear(
        dense.in_features,
        dense.out_features,
        keep_ratio=config.keep_ratio,
        weight_init=config.weight_init,
        sign_seed=seed,
        save_scores=config.save_scores,
        generator=torch.Generator().manual_seed(seed),
        bias=config.bias and dense.bias is not None,
    )
    if config.init == "dense":
        layer.start_from(dense.weight.cpu().float())
    layer = layer.to(device=dense.weight.device, dtype=dense.weight.dtype)
    if layer.bias is not None:  # after the move: the bias of a model on the meta device is meta too
        layer.bias.data.copy_(dense.bias)
    return layer


def attention_length(model: nn.Module, config: BipropConfig) -> int:
    """Longest sequence the encoder attention sees (PatchTST: patches (+ CLS), Informer: ``context_length``); a
    given ``attention_length`` shorter than that is refused now rather than at the first forward."""
    model_config = model.config
    if model_config.model_type == "patchtst":
        patches = (
            max(model_config.context_length, model_config.patch_length) - model_config.patch_length
        ) // model_config.patch_stride + 1
        needed = patches + int(bool(model_config.use_cls_token))
    else:
        needed = int(model_config.context_length)
    if config.attention_length is None:
        return needed
    if config.attention_length < needed:
        raise ValueError(
            f"attention_length={config.attention_length} is shorter than the {needed} steps the encoder attention of "
            f"this {type(model).__name__} sees; pass attention_length >= {needed}, or leave it out to use {needed}"
        )
    return config.attention_length


def model_options(model: nn.Module, config: BipropConfig) -> dict:
    """Resolve the SBT attention option: which encoder attention modules, mask length and keep ratio."""
    if config.attention is None:
        return {}
    prefix = encoder_name(model) + "."
    modules = [
        name
        for name, module in model.named_modules()
        if name.startswith(prefix) and type(module).__name__ in INTERFACE_ATTENTION
    ]
    if not modules:
        kinds = sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith(("attn", "attention"))})
        raise ValueError(
            f"attention={config.attention!r} needs encoder attention that dispatches through transformers' "
            f"AttentionInterface ({', '.join(INTERFACE_ATTENTION)}); {type(model).__name__} has {kinds}. "
            "Use attention=None for this model (Autoformer's auto-correlation and Informer's ProbSparse attention "
            "compute attention their own way), or attention_type='full' for Informer."
        )
    if getattr(model.config, "channel_attention", False):
        raise ValueError(
            f"attention={config.attention!r} masks attention over time steps, but channel_attention=True also runs "
            "the same attention over channels; build the model with channel_attention=False"
        )
    return {
        "attention_modules": modules,
        "attention_length": attention_length(model, config),
        "attention_keep_ratio": config.keep_ratio
        if config.attention_keep_ratio is None
        else config.attention_keep_ratio,
    }


#: The method's build code (its package's ``MethodRecord`` points here).
METHOD = Method(
    "biprop",
    BipropConfig,
    default_targets,
    build,
    accepts=projection_types(),
    keywords={"all-linear": encoder_linears},
    model_options=model_options,
    reads_weights=lambda config: config.init == "dense" or config.bias,  # random: frozen weights from the seed
    layers=(BipropLinear,),
    options=(SBTAttention,),
)


def apply_attention(
    model: nn.Module, attention: str, keep_ratio: float = 1.0, seed: int = 0, length: int | None = None
) -> nn.Module:
    """Install an SBT attention option on an uncompressed model (the dense baseline with the same attention).

    Not recorded in ``config.compression_config``: a dense model saved afterwards loads with plain attention.
    """
    config = BipropConfig(attention=attention, keep_ratio=keep_ratio, weight_seed=seed, attention_length=length)
    install_attention(model, {**config.to_dict(), **model_options(model, config)})
    return model
