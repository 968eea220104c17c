"""Size and cost of a model before and after compression: parameters, storage bits, FLOPs, per module and total."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn


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


def tensor_bits(module: nn.Module) -> int:
    """Bits of a module's own parameters and persistent buffers as stored."""
    tensors = list(module.parameters()) + [b for _, b in module.named_buffers()]
    return sum(t.numel() * t.element_size() * 8 for t in tensors)


def module_cost(name: str, layer: nn.Module, tokens: int) -> ModuleCost:
    """Costs of a compressed layer; a layer may override storage with ``storage_bits()`` (e.g. packed bits)."""
    reference = next(layer.parameters())
    dense_params = layer.dense_parameters()
    dense_flops = 2 * tokens * (layer.in_features * layer.out_features) if hasattr(layer, "in_features") else 0
    return ModuleCost(
        name=name,
        type=layer.layer_type,
        dense_params=dense_params,
        params=sum(p.numel() for p in layer.parameters()),
        dense_bits=dense_params * reference.element_size() * 8,
        bits=layer.storage_bits() if hasattr(layer, "storage_bits") else tensor_bits(layer),
        dense_flops=dense_flops,
        flops=2 * layer.multiply_adds(tokens, cached=True)[0],
    )


def compression_report(model: nn.Module, tokens: int = 1) -> dict:
    """Per compressed module and in total: parameters, storage bits and FLOPs, dense (before) and now (after).

    ``tokens`` is the number of input rows one forward pushes through each module (batch × sequence length,
    times channels for channel-independent models like PatchTST). FLOPs count a multiply-add as 2 and follow
    the path each layer actually takes at inference (see ``CPLinear.multiply_adds``).
    """
    compression = getattr(model.config, "compression_config", None) or {}
    rows = [module_cost(name, model.get_submodule(name), tokens) for name in compression.get("modules", {})]
    model_params = sum(p.numel() for p in model.parameters())
    total = {
        key: sum(getattr(row, key) for row in rows)
        for key in ("dense_params", "params", "dense_bits", "bits", "dense_flops", "flops")
    }
    return {
        "method": compression.get("method", "dense"),
        "tokens": tokens,
        "modules": [asdict(row) for row in rows],
        "targets": total,
        "model": {
            "dense_params": model_params - total["params"] + total["dense_params"],
            "params": model_params,
        },
    }
