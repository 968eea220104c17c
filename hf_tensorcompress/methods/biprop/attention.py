"""SBT attention options as transformers attention functions, not forked attention code.

* ``step_t``: earlier time steps attend only to themselves; the last step attends to every earlier step and not to
  itself (paper §3.3.2, Fig. 2).
* ``qkv_mask``: fixed random 0/1 masks on the Q, K and V activations (``length × head_dim``, one per projection,
  shared by the heads of a module), persistent buffers ``sbt_qkv_mask`` of the attention module (paper §3.3.1).

Both are registered in ``AttentionInterface`` and selected by ``config._attn_implementation``; only attention modules
flagged by ``install_attention`` get them, every other attention module of the model runs plain eager attention.
The options are driven by ``config.compression_config`` (keys ``attention``, ``attention_keep_ratio``,
``attention_length``, ``weight_seed``, ``attention_modules``), so remote-code loading re-installs them.

Ships inside saved checkpoints: torch and transformers only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ...runtime.contract import ATTENTION_COST, ModelOption

IMPLEMENTATIONS = {"step_t": "sbt_step_t", "qkv_mask": "sbt_qkv_mask"}
MASK_BUFFER = "sbt_qkv_mask"
_FLAG = "sbt_attention"


def step_t_allowed(
    query_length: int, key_length: int | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """Bool ``(query_length, key_length)``: True where the query step may attend to the key step."""
    key_length = query_length if key_length is None else key_length
    allowed = torch.eye(query_length, key_length, dtype=torch.bool, device=device)
    allowed[-1, :] = True
    allowed[-1, min(query_length, key_length) - 1] = False
    if key_length == 1:  # a single step has nothing earlier to look at: let it see itself
        allowed[-1, 0] = True
    return allowed


def sbt_attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """Eager attention (``query``/``key``/``value``: batch × heads × steps × head_dim) plus the module's SBT option.

    One function serves both registered names: the option is read from the module, so the attention modules the
    user did not select (e.g. a decoder) keep plain attention.
    """
    option = getattr(module, _FLAG, None)
    if option == "qkv_mask":
        masks = getattr(module, MASK_BUFFER)
        if max(query.shape[-2], key.shape[-2]) > masks.shape[1]:
            raise ValueError(
                f"the Q/K/V masks cover {masks.shape[1]} steps but the input has {max(query.shape[-2], key.shape[-2])}; "
                "set CompressionConfig.attention_length to the longest sequence the attention sees"
            )
        query = query * masks[0, : query.shape[-2]].to(query.dtype)
        key = key * masks[1, : key.shape[-2]].to(key.dtype)
        value = value * masks[2, : value.shape[-2]].to(value.dtype)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if option == "step_t":
        allowed = step_t_allowed(query.shape[-2], key.shape[-2], query.device)
        weights = weights.masked_fill(~allowed, torch.finfo(weights.dtype).min)
    if attention_mask is not None:
        weights = weights + attention_mask[..., : key.shape[-2]]
    weights = nn.functional.softmax(weights, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def register_attention_functions() -> None:
    """Our attention names, plus eager-format mask creation for them (else causal/padding masks would be dropped)."""
    for implementation in IMPLEMENTATIONS.values():
        AttentionInterface.register(implementation, sbt_attention)
        AttentionMaskInterface.register(implementation, eager_mask)


def random_qkv_masks(length: int, head_dim: int, keep_ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Bool ``(3, length, head_dim)`` on the CPU: for Q, K, V each, exactly ``round(keep_ratio · length · head_dim)``
    ones (drawn on the CPU whatever the default device, so a model built on the meta device draws the same)."""
    numel = length * head_dim
    keep = max(1, round(keep_ratio * numel))
    masks = torch.zeros(3, numel, dtype=torch.bool, device="cpu")
    for row in masks:
        row[torch.randperm(numel, generator=generator, device="cpu")[:keep]] = True
    return masks.view(3, length, head_dim)


def qkv_masks(model: nn.Module, options: dict) -> dict[str, torch.Tensor]:
    """The seeded Q/K/V masks of every listed attention module, in order from one generator (``options`` as for
    ``install_attention``); also what re-initialises a mask no checkpoint filled."""
    generator = torch.Generator().manual_seed(int(options.get("weight_seed", 0)))
    return {
        name: random_qkv_masks(
            options["attention_length"], model.get_submodule(name).head_dim, options["attention_keep_ratio"], generator
        )
        for name in options["attention_modules"]
    }


def sbt_multiply_adds(module: nn.Module, steps: int) -> dict:
    """Non-zero multiply-adds of ``QKᵀ`` and ``AV`` for one sequence under the module's option (the paper's Table 5):
    Step-T computes only the last row (earlier rows are identities, and ``AV`` counts twice because V is dense);
    Q/K/V masks keep their kept fraction of the entries."""
    head_dim, heads = module.head_dim, module.num_heads
    if getattr(module, _FLAG) == "step_t":
        qk, av = (steps - 1) * head_dim, 2 * (steps - 1) * head_dim
    else:
        keep = float(getattr(module, MASK_BUFFER).float().mean())
        qk, av = round(head_dim * (steps * keep) ** 2), round(head_dim * steps * steps * keep)
    return {"qk": heads * qk, "av": heads * av}


def install_attention(model: nn.Module, options: dict) -> None:
    """Flag the listed attention modules, give ``qkv_mask`` modules their (seeded) mask buffers, select the function.

    ``options``: ``attention`` (``"step_t"``/``"qkv_mask"``/None), ``attention_modules`` (full names),
    ``attention_length``, ``attention_keep_ratio``, ``weight_seed``. Masks are drawn from the seed, then replaced by
    the checkpoint's buffers when a saved model loads.
    """
    kind = options.get("attention")
    if kind is None:
        return
    if kind not in IMPLEMENTATIONS:
        raise ValueError(f"unknown SBT attention option {kind!r}; known: {sorted(IMPLEMENTATIONS)}")
    register_attention_functions()
    masks_by_name = qkv_masks(model, options) if kind == "qkv_mask" else {}
    for name in options["attention_modules"]:
        module = model.get_submodule(name)
        setattr(module, _FLAG, kind)
        setattr(module, ATTENTION_COST, sbt_multiply_adds)
        if kind == "qkv_mask":
            masks = masks_by_name[name]
            reference = next(iter([*module.parameters(), *module.buffers()]), masks)
            module.register_buffer(MASK_BUFFER, masks.to(reference.device), persistent=True)
    model.config._attn_implementation_internal = IMPLEMENTATIONS[kind]
    for sub in model.modules():  # sub-models holding their own config object
        config = getattr(sub, "config", None)
        if config is not None and config is not model.config and hasattr(config, "_attn_implementation_internal"):
            config._attn_implementation_internal = IMPLEMENTATIONS[kind]


class SBTAttention(ModelOption):
    """The ``attention`` entry of a biprop ``compression_config`` as a model option: re-installed on load, its Q/K/V
    masks redrawn from the seed where a checkpoint lacks them."""

    key = "attention"

    @classmethod
    def install(cls, model: nn.Module, compression: dict) -> None:
        install_attention(model, compression)

    @classmethod
    def tensors(cls, model: nn.Module, compression: dict) -> dict[str, torch.Tensor]:
        if compression.get("attention") != "qkv_mask":
            return {}
        modules = (model.get_submodule(name) for name in compression.get("attention_modules", []))
        # before ``install`` (transformers' init during the base class's __init__) the buffers do not exist yet
        return {
            f"{name}.{MASK_BUFFER}": getattr(module, MASK_BUFFER)
            for name, module in zip(compression.get("attention_modules", []), modules)
            if hasattr(module, MASK_BUFFER)
        }

    @classmethod
    def initial_tensors(cls, model: nn.Module, compression: dict) -> dict[str, torch.Tensor]:
        if compression.get("attention") != "qkv_mask":
            return {}
        return {f"{name}.{MASK_BUFFER}": masks for name, masks in qkv_masks(model, compression).items()}

    @classmethod
    def dense_equivalent(cls, compression: dict) -> str | None:
        return (
            f"biprop's attention={compression['attention']!r} changes the attention itself, which a plain "
            f"{{base}} cannot run; only models compressed with attention=None decompress"
        )
