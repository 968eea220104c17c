"""The arms a user would pick instead of the library at equal bytes, and the library's answer on every Linear:
post-training and ternary quantization (``quant`` extra) and ``svd-all`` (every Linear as ``U Vᵀ``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.baselines import quantization
from hf_tensorcompress.compress import refresh_compression_config
from hf_tensorcompress.core.metrics import linear_modules

from .costs import scope_names

#: Post-training quantization of each seed's dense run (``ptq-<scheme>-<scope>``; no training of their own).
PTQ_ARMS = tuple(f"ptq-{scheme}-{scope}" for scope in ("qkv", "all") for scheme in quantization.SCHEMES)
#: Ternary quantization-aware training from the first step, at the same steps (``qat-ternary-<scope>``).
QAT_ARMS = ("qat-ternary-qkv", "qat-ternary-all")
#: Bits and group size the factors of every ``svd-all`` run are also stored in after training (``<run>+<name>``,
#: through ``LowRankLinear.set_factor_bits``, then saved and loaded back); ``-q4`` arms train with 4-bit factors.
FACTOR_SCHEMES = {"int8": (8, None), "int4": (4, 32), "int2": (2, 32)}
TRAINED_FACTOR_BITS = (4, 32)
#: Layers with a side this narrow stay dense in the ``svd-all`` arms: PatchTST's patch embedding (16 inputs) at
#: half its parameters keeps rank 7, and that alone took the test MSE of seed 0 from 0.48 to 0.72.
NARROWEST_FACTORED = 32


def ternary(model: torch.nn.Module, scope: str) -> dict[str, int]:
    """Ternary QAT of ``scope`` in place; the deployed bytes of those layers (2-bit codes, a scale, the bias)."""
    names = scope_names(model, scope)
    quantization.ternary_training(model, names)
    return {
        name: quantization.ternary_bytes(m.out_features, m.in_features)
        + (m.bias.numel() * 4 if m.bias is not None else 0)
        for name in names
        for m in [model.get_submodule(name)]
    }


def prepare_ternary(scope: str) -> Callable:
    """An arm's ``prepare``: ternary QAT of ``scope``; its layers deploy as 2-bit codes plus a scale."""
    return lambda model, final_ranks: ternary(model, scope)


def low_rank_targets(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The Linear layers the ``svd-all`` arms factor: every one with both sides >= ``NARROWEST_FACTORED``."""
    return {
        name: m for name, m in linear_modules(model).items() if min(m.in_features, m.out_features) >= NARROWEST_FACTORED
    }


def svd_all_ranks(model: torch.nn.Module, ratio: float) -> dict[str, int]:
    """The SVD rank of every factored Linear at ``ratio`` of its weight parameters."""
    return {
        name: max(
            1,
            min(
                min(m.in_features, m.out_features),
                int(ratio * m.in_features * m.out_features / (m.in_features + m.out_features)),
            ),
        )
        for name, m in low_rank_targets(model).items()
    }


def prepare_svd_all(ratio: float, factor_bits: tuple[int, int | None] | None = None) -> Callable:
    """An arm's ``prepare``: every Linear but the narrowest becomes ``U Vᵀ``, at ``ratio`` of its parameters, or at full rank
    (``min(in, out)``, the dense weight exactly) when a schedule cuts it later; ``factor_bits`` (bits, group):
    the factors train rounded to those bits from the first step."""
    bits, group = factor_bits or (None, None)

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        ranks = final_ranks or {name: min(m.in_features, m.out_features) for name, m in low_rank_targets(model).items()}
        apply_compression(
            model,
            CompressionConfig(
                method="svd",
                target_modules=list(ranks),
                rank=1.0,
                ranks=ranks,
                factor_bits=bits,
                factor_group_size=group,
            ),
        )

    return prepare


def ptq_transform(scheme: str, scope: str) -> Callable:
    """A post-training arm's ``transform``: round ``scope``'s Linear weights to ``scheme`` (torchao weight-only)."""

    def transform(model: torch.nn.Module) -> None:
        quantization.quantize_linears(model, scope_names(model, scope), scheme)

    return transform


def factor_transform(bits: int, group: int | None) -> Callable:
    """Store every low-rank layer's factors in ``bits`` (the library's ``factor_bits``), spec re-recorded."""

    def transform(model: torch.nn.Module) -> None:
        for module in model.modules():
            if hasattr(module, "set_factor_bits"):
                module.set_factor_bits(bits, group)
        refresh_compression_config(model)

    return transform
