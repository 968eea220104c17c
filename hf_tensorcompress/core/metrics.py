"""Size and cost of a model before and after compression: parameters, storage bits, FLOPs, per module and total."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..runtime.contract import ATTENTION_COST, CompressedLayer, TiedHead

#: ν/τ: memory vs computation energy per float32 (the TensorSLM paper's energy model, its App. F.3).
NU_OVER_TAU = 5.0


def estimated_energy(bits: int, flops: int, nu_over_tau: float = NU_OVER_TAU) -> float:
    """ν·(32-bit words read) + τ·FLOPs, in units of τ."""
    return nu_over_tau * bits / 32 + flops


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


def module_cost(name: str, layer: CompressedLayer, tokens: int, dense_bits: int = 32) -> ModuleCost:
    """Costs of a compressed layer against the dense module it replaced (``dense_bits`` a weight), through the layer
    contract."""
    dense_params = layer.dense_parameters()
    return ModuleCost(
        name=name,
        type=layer.layer_type,
        dense_params=dense_params,
        params=layer.stored_parameters(),
        dense_bits=dense_params * dense_bits,
        bits=layer.storage_bits(),
        dense_flops=2 * layer.dense_multiply_adds(tokens),
        flops=2 * layer.multiply_adds(tokens, cached=True)[0],
    )


def layer_path(layer: CompressedLayer, tokens: int) -> str:
    """The name of the path ``layer`` takes at inference for ``tokens`` input rows (``multiply_adds``' second item)."""
    return layer.multiply_adds(tokens, cached=True)[1]


def tied_head_costs(model: nn.Module, layers: dict[str, CompressedLayer], tokens: int) -> list[ModuleCost]:
    """The output layer of a tied model that reads a compressed embedding's storage: no tensors of its own, but the
    FLOPs of the full ``hidden @ tableᵀ`` (every row is decoded or looked up at every step)."""
    rows = []
    for name, module in model.named_modules():
        embedding = getattr(module, "embedding", None)
        if isinstance(module, TiedHead) and any(embedding is layer for layer in layers.values()):
            flops = 2 * tokens * module.in_features * module.out_features
            rows.append(ModuleCost(name, "tied_head", 0, 0, 0, 0, flops, flops))
    return rows


def compression_report(model: nn.Module, tokens: int = 1) -> dict:
    """Per compressed module and in total: parameters, storage bits and FLOPs, dense (before) and now (after).

    ``tokens`` is the number of input rows one forward pushes through each module (batch × sequence length,
    times channels for channel-independent models like PatchTST). FLOPs count a multiply-add as 2 and follow
    the path each layer actually takes at inference, named in each module row's ``path`` (see
    ``CPLinear.multiply_adds``: a CP layer whose factorized product would cost more than a dense matmul runs the
    dense matmul with its rebuilt weight cached, ``"reconstruct"``, so its FLOPs equal the dense ones). A tied output
    layer reading a compressed embedding is a row of its own (FLOPs only: it stores nothing). ``model``: parameters
    of the whole model (a compressed layer counts its stored values, whatever their width, buffers included);
    ``bytes``: on disk and in RAM, of the compressed modules, of every Linear layer and of the whole model.

    Every "dense" figure (``dense_bits``, ``bytes[...]["dense"]``) is the dense model in one precision,
    ``dense_dtype``: the one the model's uncompressed float tensors keep (bf16 for a model compressed in bf16, fp32
    for one in fp32), so that no two lines of a report compare against different baselines.
    """
    compression = getattr(model.config, "compression_config", None) or {}
    layers = {name: model.get_submodule(name) for name in compression.get("modules", {})}
    inside = {id(t) for layer in layers.values() for t in [*layer.parameters(), *layer.buffers()]}
    dtype = dense_dtype(model, inside)
    width = torch.finfo(dtype).bits
    rows = [module_cost(name, layer, tokens, width) for name, layer in layers.items()]
    rows += tied_head_costs(model, layers, tokens)
    outside = sum(p.numel() for p in model.parameters() if id(p) not in inside)
    total = {
        key: sum(getattr(row, key) for row in rows)
        for key in ("dense_params", "params", "dense_bits", "bits", "dense_flops", "flops")
    }
    model_params = {"dense_params": outside + total["dense_params"], "params": outside + total["params"]}
    return {
        "method": compression.get("method", "dense"),
        "tokens": tokens,
        "dense_dtype": str(dtype).removeprefix("torch."),
        # "path": how each module computes its forward at inference (e.g. CP "factorized", or "reconstruct": one
        # dense matmul with the weight rebuilt once and cached, taken when that is cheaper for ``tokens`` rows)
        "modules": [asdict(row) | {"path": _path(layers.get(row.name), tokens)} for row in rows],
        "targets": total,
        "model": model_params,
        "bytes": {
            "targets": _with_ratios(_layer_bytes(layers.values(), width // 8)),
            "linear": _bytes_of(model, width // 8),
            "model": _with_ratios(_model_bytes(model, model_params["dense_params"], width // 8)),
        },
    }


def dense_dtype(model: nn.Module, compressed: set[int]) -> torch.dtype:
    """The precision of the dense model a report compares against: the one most of the model's float tensors outside
    its compressed layers (ids in ``compressed``) keep; fp32 where there are none."""
    counts: dict[torch.dtype, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in compressed and tensor.is_floating_point():
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def _path(layer: CompressedLayer | None, tokens: int) -> str:
    return "tied to the embedding" if layer is None else layer_path(layer, tokens)


def _with_ratios(total: dict) -> dict:
    dense = total["dense"] or 1
    return total | {"disk_ratio": total["disk"] / dense, "ram_ratio": total["ram"] / dense}


def _layer_bytes(layers, dense_bytes: int) -> dict:
    """Compressed layers: what they store (disk), hold (RAM) and replaced (dense, ``dense_bytes`` a weight)."""
    layers = list(layers)
    return {
        "dense": sum(layer.dense_parameters() * dense_bytes for layer in layers),
        "disk": sum(layer.storage_bits() // 8 for layer in layers),
        "ram": sum(resident_bytes(layer) for layer in layers),
    }


def _model_bytes(model: nn.Module, dense_params: int, dense_bytes: int) -> dict:
    """The whole model: what ``save_pretrained`` writes (a compressed layer as it stores itself, every other
    tensor of the state dict once; non-persistent buffers are not saved), what it holds in memory, and the dense
    model (``dense_bytes`` a weight)."""
    layers = {f"{name}.": m for name, m in model.named_modules() if isinstance(m, CompressedLayer)}
    rest = {
        id(tensor): tensor
        for key, tensor in model.state_dict(keep_vars=True).items()
        if not key.startswith(tuple(layers))  # a layer may write its storage as tensors made for the state dict
    }
    disk = sum(layer.storage_bits() // 8 for layer in layers.values())
    disk += sum(tensor_bytes(t)[0] for t in rest.values())
    ram = sum(resident_bytes(layer) for layer in layers.values()) + sum(tensor_bytes(t)[1] for t in rest.values())
    return {"dense": dense_params * dense_bytes, "disk": disk, "ram": ram}


def _bytes_of(model: nn.Module, dense_bytes: int) -> dict:
    """``linear_bytes`` totals of every Linear layer, the dense ones at ``dense_bytes`` a weight (not fp32's 4)."""
    totals = linear_bytes(model)
    return _with_ratios({"dense": totals["dense"] // 4 * dense_bytes, "disk": totals["disk"], "ram": totals["ram"]})


# ---------------------------------------------------------------------- non-zero FLOPs of a whole forward
def attention_multiply_adds(steps: int, head_dim: int, heads: int) -> dict:
    """Multiply-adds of ``QKᵀ`` and ``AV`` for one sequence of canonical attention (``d·w²`` each per head)."""
    return {"qk": heads * head_dim * steps * steps, "av": heads * head_dim * steps * steps}


def nonzero_flops(model: nn.Module, **inputs) -> dict:
    """Non-zero FLOPs (2 per multiply-add) of one forward on ``inputs``, measured with hooks.

    Every ``nn.Linear`` counts ``rows·in·out``, a compressed layer its own ``multiply_adds`` (e.g. only kept weights),
    and every attention module with ``head_dim``/``num_heads`` the count of the attention it runs: its
    ``ATTENTION_COST`` function where a method's option installed one (e.g. Sparse Binary Transformers' Step-T),
    canonical otherwise. Q-scaling, softmax, norms and the embedding are left out, as in the SBT paper's Table 5.
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
        cost = getattr(module, ATTENTION_COST, None)
        counts = cost(module, steps) if cost else attention_multiply_adds(steps, module.head_dim, module.num_heads)
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
            total += tensor_bytes(tensor)[0] * 8  # a quantized weight (torchao) counts its packed codes and scales
            covered.add(id(tensor))
    return total


# ---------------------------------------------------------------------- bytes of every Linear weight
def _bits_of(dtype: torch.dtype) -> int:
    """Bits per element of ``dtype``, sub-byte integer dtypes (``torch.int4``) included."""
    digits = "".join(ch for ch in str(dtype).rsplit(".", 1)[-1] if ch.isdigit())
    return int(digits) if digits else torch.empty(0, dtype=dtype).element_size() * 8


def tensor_bytes(tensor: torch.Tensor) -> tuple[int, int]:
    """(bytes on disk with codes packed at their bit width, bytes resident in RAM) of one tensor.

    A tensor subclass that holds its data in inner tensors (torchao's quantized weights) counts those; its ``qdata``
    packs at its ``target_dtype`` on disk (torchao keeps int4/int2 codes unpacked in int8 bytes in RAM on x86)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None or type(tensor) in (torch.Tensor, nn.Parameter):
        size = tensor.numel() * tensor.element_size()
        return size, size
    disk = ram = 0
    target = getattr(tensor, "target_dtype", None)
    for name in flatten()[0]:
        inner = getattr(tensor, name)
        inner_disk, inner_ram = tensor_bytes(inner)
        if name == "qdata" and target is not None:
            inner_disk = (inner.numel() * _bits_of(target) + 7) // 8
        disk, ram = disk + inner_disk, ram + inner_ram
    return disk, ram


def resident_bytes(module: nn.Module) -> int:
    """Bytes a module holds in memory: its parameters and buffers and the tensors it caches in attributes (dicts,
    tuples and lists too), each counted once; meta tensors hold none."""
    seen, total = set(), 0

    def count(value) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor) and id(value) not in seen and not value.is_meta:
            seen.add(id(value))
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                count(item)
        elif isinstance(value, (tuple, list)):
            for item in value:
                count(item)

    for value in [*module.parameters(), *module.buffers(), *vars(module).values()]:
        count(value)
    return total


def linear_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every ``nn.Linear`` and every compressed layer that replaced one (``in_features``/``out_features``), by name;
    modules inside a compressed layer are part of it."""
    found: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if any(name.startswith(outer + ".") for outer in found):
            continue
        if isinstance(module, nn.Linear) or (isinstance(module, CompressedLayer) and hasattr(module, "out_features")):
            found[name] = module
    return found


def linear_bytes(model: nn.Module, packed: dict[str, int] | None = None) -> dict:
    """Bytes of every Linear layer's weights and biases: on disk, resident in RAM, and as dense fp32 (the 1× of the
    ratios), in total and per module.

    A compressed layer counts its ``storage_bits()`` on disk and the tensors it holds in RAM; a torchao-quantized
    weight its packed codes and scales (``tensor_bytes``). ``packed`` overrides the disk bytes of named modules whose
    deployed form differs from how they train (e.g. ternary QAT: fp32 latent weights, deployed five codes a byte).
    """
    rows = {}
    for name, module in linear_modules(model).items():
        bias = getattr(module, "bias", None) is not None
        dense = (module.in_features * module.out_features + (module.out_features if bias else 0)) * 4
        tensors = [*module.parameters(), *module.buffers()]
        ram = sum(tensor_bytes(t)[1] for t in tensors)
        if isinstance(module, CompressedLayer):
            disk = module.storage_bits() // 8
        else:
            disk = sum(tensor_bytes(t)[0] for t in tensors)
        if packed and name in packed:
            disk = packed[name]
        rows[name] = {"dense": dense, "disk": disk, "ram": ram}
    total = {key: sum(row[key] for row in rows.values()) for key in ("dense", "disk", "ram")}
    dense = total["dense"] or 1  # a model without nn.Linear layers (e.g. GPT-2's Conv1D): ratios of 0
    return {**total, "disk_ratio": total["disk"] / dense, "ram_ratio": total["ram"] / dense, "modules": rows}
