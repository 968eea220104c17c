"""What a user would try before compressing: weight-only quantization of a trained model, or low-bit training.

* Post-training quantization (PTQ): round-to-nearest of the trained weights through torchao's ``quantize_``
  (``IntxWeightOnlyConfig``, symmetric): int8 per output row, int4 and int2 in groups of 32. On x86 CPUs torchao
  0.18 keeps int4/int2 codes unpacked in int8 bytes (the packed kernels are not in its x86 wheel), so their RAM is
  one byte per weight while their bytes on disk count the codes packed at their bit width.
* Quantization-aware training (QAT): BitNet b1.58's ternary weights (absmean scale per tensor, straight-through
  estimator), weight-only, hand-written (``ternary_training`` says why); trains fp32 latent weights, deployed as
  five codes a byte (the library's ternary packing, ``runtime/ternary.py``) plus one scale.

Needs the ``quant`` extra.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..core.extras import require
from ..runtime.ternary import TRITS_PER_BYTE

#: scheme -> (bits, group size along the input axis; None = one scale per output row)
SCHEMES: dict[str, tuple[int, int | None]] = {"int8": (8, None), "int4": (4, 32), "int2": (2, 32)}


def _scheme(scheme: str) -> tuple[int, int | None]:
    if scheme not in SCHEMES:
        raise ValueError(f"quantization scheme {scheme!r} is not known; choose one of {sorted(SCHEMES)}")
    return SCHEMES[scheme]


def group_for(columns: int, group: int | None) -> int | None:
    """The group size actually used for a weight with ``columns`` inputs: per row when groups do not divide it."""
    return group if group is not None and columns % group == 0 and columns > group else None


def ptq_config(scheme: str, columns: int):
    """torchao's weight-only config for ``scheme`` on a weight with ``columns`` inputs."""
    bits, group = _scheme(scheme)
    quantization = require("torchao.quantization", "weight-only quantization baselines")
    granularity = require("torchao.quantization.granularity", "weight-only quantization baselines")
    size = group_for(columns, group)
    return quantization.IntxWeightOnlyConfig(
        weight_dtype=getattr(torch, f"int{bits}"),
        granularity=granularity.PerGroup(size or columns),  # one group per row (PerAxis(0) fails on 1 input)
    )


def quantize_linears(model: nn.Module, names: Iterable[str], scheme: str) -> nn.Module:
    """Round the weights of the ``nn.Linear`` modules ``names`` of ``model`` to ``scheme`` in place (PTQ).

    A Linear with a single input stays fp32 (and is counted so): torchao 0.18 cannot quantize a ``(out, 1)`` weight
    (its scale reshape fails); PatchTST with patch length 1 has one such embedding, ``d_model`` weights."""
    quantization = require("torchao.quantization", "weight-only quantization baselines")
    for name in names:
        module = model.get_submodule(name)
        if type(module) is not nn.Linear:
            raise TypeError(f"{name} is a {type(module).__name__}; weight-only PTQ here rounds nn.Linear weights")
        if module.in_features == 1:
            continue
        config = ptq_config(scheme, module.in_features)
        quantization.quantize_(module, config, filter_fn=lambda m, fqn, target=module: m is target)
    return model


class TernaryWeight(nn.Module):
    """BitNet b1.58's weight rounding as a parametrization: ``W → γ · clamp(round(W / γ), -1, 1)`` with the absmean
    scale ``γ = mean |W|``, and a straight-through gradient to the fp32 latent ``W``."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        scale = weight.detach().abs().mean().clamp_min(1e-8)
        ternary = (weight / scale).round().clamp(-1, 1) * scale
        return weight + (ternary - weight).detach()


def ternary_training(model: nn.Module, names: Iterable[str]) -> nn.Module:
    """Make the ``nn.Linear`` modules ``names`` train with ternary weights (weight-only b1.58 QAT), in place.

    Hand-written: torchao 0.18's ``bitnet_training`` prototype runs on this CPU but fails on PatchTST's
    non-contiguous activations (it ``view``s its input), and it also quantizes activations."""
    for name in names:
        module = model.get_submodule(name)
        if type(module) is not nn.Linear:
            raise TypeError(f"{name} is a {type(module).__name__}; ternary QAT here trains nn.Linear weights")
        parametrize.register_parametrization(module, "weight", TernaryWeight())
    return model


def ternary_bytes(rows: int, columns: int) -> int:
    """Bytes of a deployed ternary weight: each row's codes five a byte (1.6 bits a weight, as the library's ternary
    storage packs them; 1.58 is the entropy bound) plus one fp32 absmean scale."""
    return rows * -(-columns // TRITS_PER_BYTE) + 4
