"""Size and cost of a model before and after compression: parameters, storage bits, FLOPs, per module and total."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .contract import CompressedLayer


@dataclass
class ModuleCost:
    """One compressed module against the dense module it replaced."""

    name: str
    type: str
    dense_params: int
    params: int
    dense_bits: int
    bits: int
    dense_flops: int
    flops: int


def module_cost(name: str, layer: CompressedLayer, tokens: int) -> ModuleCost:
    """Costs of a compressed layer against the dense module it replaced, through the layer contract."""
    reference = next(t for t in [*layer.parameters(), *layer.buffers()] if t.is_floating_point())
    dense_params = layer.dense_parameters()
    return ModuleCost(
        name=name,
        type=layer.layer_type,
        dense_params=dense_params,
        params=layer.stored_parameters(),
        dense_bits=dense_params * reference.element_size() * 8,
        bits=layer.storage_bits(),
        dense_flops=2 * layer.dense_multiply_adds(tokens),
        flops=2 * layer.multiply_adds(tokens, cached=True)[0],
    )


def layer_path(layer: CompressedLayer, tokens: int) -> str:
    """The name of the path ``layer`` takes at inference for ``tokens`` input rows (``multiply_adds``' second item)."""
    return layer.multiply_adds(tokens, cached=True)[1]


def compression_report(model: nn.Module, tokens: int = 1) -> dict:
    """Per compressed module and in total: parameters, storage bits and FLOPs, dense (before) and now (after).

    ``tokens`` is the number of input rows one forward pushes through each module (batch × sequence length,
    times channels for channel-independent models like PatchTST). FLOPs count a multiply-add as 2 and follow
    the path each layer actually takes at inference, named in each module row's ``path`` (see
    ``CPLinear.multiply_adds``: a CP layer whose factorized product would cost more than a dense matmul runs the
    dense matmul with its rebuilt weight cached, ``"reconstruct"``, so its FLOPs equal the dense ones).
    """
    compression = getattr(model.config, "compression_config", None) or {}
    layers = {name: model.get_submodule(name) for name in compression.get("modules", {})}
    rows = [module_cost(name, layer, tokens) for name, layer in layers.items()]
    model_params = sum(p.numel() for p in model.parameters())
    total = {
        key: sum(getattr(row, key) for row in rows)
        for key in ("dense_params", "params", "dense_bits", "bits", "dense_flops", "flops")
    }
    return {
        "method": compression.get("method", "dense"),
        "tokens": tokens,
        # "path": how each module computes its forward at inference (e.g. CP "factorized", or "reconstruct": one
        # dense matmul with the weight rebuilt once and cached, taken when that is cheaper for ``tokens`` rows)
        "modules": [asdict(row) | {"path": layer_path(layers[row.name], tokens)} for row in rows],
        "targets": total,
        "model": {
            "dense_params": model_params - total["params"] + total["dense_params"],
            "params": model_params,
        },
    }


# ---------------------------------------------------------------------- SBT: non-zero FLOPs of a whole forward
def attention_multiply_adds(kind: str | None, steps: int, head_dim: int, heads: int, keep_ratio: float = 1.0) -> dict:
    """Non-zero multiply-adds of ``QKᵀ`` and ``AV`` for one sequence (Sparse Binary Transformers, Table 5).

    ``kind``: ``None`` (canonical), ``"step_t"`` (only the last row is computed; earlier rows are identities, and
    ``AV`` counts twice because V is dense) or ``"qkv_mask"`` (Q, K, V keep ``keep_ratio`` of their entries).
    """
    w, d = steps, head_dim
    if kind == "step_t":
        qk, av = (w - 1) * d, 2 * (w - 1) * d
    elif kind == "qkv_mask":
        qk, av = round(d * (w * keep_ratio) ** 2), round(d * w * w * keep_ratio)
    else:
        qk, av = d * w * w, d * w * w
    return {"qk": heads * qk, "av": heads * av}


def nonzero_flops(model: nn.Module, **inputs) -> dict:
    """Non-zero FLOPs (2 per multiply-add) of one forward on ``inputs``, measured with hooks.

    Every ``nn.Linear`` counts ``rows·in·out``, a compressed layer its ``multiply_adds`` (e.g. biprop: only kept weights) its
    own count, and every attention module with ``head_dim``/``num_heads`` the Table 5 count of the SBT option it
    runs (``sbt_attention`` flag; canonical otherwise). Q-scaling, softmax, norms and the embedding are left out,
    as in the paper's table.
    """
    totals = {"linear": 0, "attention": 0}

    def linear_hook(module, args, output):
        rows = args[0].numel() // args[0].shape[-1]
        if isinstance(module, CompressedLayer):
            totals["linear"] += module.multiply_adds(rows, cached=True)[0]
        else:
            totals["linear"] += rows * module.in_features * module.out_features

    def attention_hook(module, args, kwargs, output):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        sequences, steps = hidden.numel() // (hidden.shape[-1] * hidden.shape[-2]), hidden.shape[-2]
        masks = getattr(module, "sbt_qkv_mask", None)
        keep = float(masks.float().mean()) if masks is not None else 1.0
        counts = attention_multiply_adds(getattr(module, "sbt_attention", None), steps, module.head_dim, module.num_heads, keep)
        totals["attention"] += sequences * sum(counts.values())

    handles = []
    for module in model.modules():
        if isinstance(module, (nn.Linear, CompressedLayer)):
            handles.append(module.register_forward_hook(linear_hook))
        elif hasattr(module, "head_dim") and hasattr(module, "num_heads") and hasattr(module, "q_proj"):
            handles.append(module.register_forward_hook(attention_hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return {key: 2 * value for key, value in totals.items()} | {"total": 2 * sum(totals.values())}


def storage_bits(model: nn.Module) -> int:
    """Bits a model's inference state takes: ``storage_bits()`` of the compressed layers, stored size of the rest."""
    total, covered = 0, set()
    for module in model.modules():
        if isinstance(module, CompressedLayer) and not any(id(t) in covered for t in module.buffers()):
            total += module.storage_bits()
            covered.update(id(t) for t in [*module.parameters(), *module.buffers()])
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in covered:
            total += tensor.numel() * tensor.element_size() * 8
            covered.add(id(tensor))
    return total
