"""Export forms of the compressed Linear layers: each keeps the layer's stored tensors as they are (fp32 factors,
packed factor codes, Biprop's mask bits) and computes the layer's output from them with standard ONNX ops
(``MatMul``/``Einsum`` chains; 4-bit factors on ``MatMulNBits`` where ``ortops.py`` maps them), so no dense weight
ever becomes an initializer.

Export-only code: the forwards here avoid what the exporter cannot trace (the fused C kernel behind ctypes, cached
weights keyed on data pointers, Python-side chunk loops).
"""

from __future__ import annotations

import torch
from torch import nn

from ...methods.biprop.layer import BipropLinear
from ...methods.cp.layer import STORED_NAMES, CPLinear
from ...methods.lowbit.layer import LowBitLinear
from ...methods.mixed.shared import SharedLinear
from ...methods.svd.layer import LowRankLinear
from ...runtime.factor_storage import stored
from .unpack import GraphCodebook, GraphLowBit, GraphTernary, graph_form, unpack_codes

#: The graph forms of a stored factor (each with ``values()`` and ``matmul_t``).
GRAPH_MATRICES = (GraphLowBit, GraphCodebook, GraphTernary)


def _factor(layer: nn.Module, stored_name: str, matrix: torch.Tensor | None) -> nn.Module | nn.Parameter:
    """A factor as the checkpoint stores it: the loaded codes, codes of a trained layer's rounded factor, or the fp32
    factor itself."""
    if layer.factor_bits is None:
        return nn.Parameter(matrix.detach(), requires_grad=False)
    if layer.stored:
        return graph_form(getattr(layer, stored_name))
    return graph_form(stored(matrix, layer.factor_bits, layer.factor_group_size))


def _values(factor: nn.Module | torch.Tensor) -> torch.Tensor:
    return factor.values() if isinstance(factor, GRAPH_MATRICES) else factor


def _matmul_t(x: torch.Tensor, factor: nn.Module | torch.Tensor) -> torch.Tensor:
    """``x @ factorᵀ``: a stored factor's own product (``MatMulNBits`` where it maps), or a ``MatMul``."""
    return factor.matmul_t(x) if isinstance(factor, GRAPH_MATRICES) else x @ factor.T


def _bias(layer: nn.Module) -> nn.Parameter | None:
    bias = layer.dense_bias()
    return None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)


class GraphCP(nn.Module):
    """``y = ((x · (A ⊙ B)) · Cᵀ) + b`` from the three CP factors: the Khatri-Rao product is an ``Einsum`` of the two
    small factors, then two ``MatMul``s (the stored form's path: never the ``out × in`` weight)."""

    def __init__(self, layer: CPLinear) -> None:
        super().__init__()
        fp32 = [None] * 3 if layer.stored else [layer.factor_heads, layer.factor_head_dim, layer.factor_out]
        self.heads, self.head_dim, self.out = (_factor(layer, name, m) for name, m in zip(STORED_NAMES, fp32))
        self.bias = _bias(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads, head_dim = _values(self.heads), _values(self.head_dim)
        khatri_rao = torch.einsum("hr,dr->hdr", heads, head_dim).reshape(-1, heads.shape[1])
        y = _matmul_t(x @ khatri_rao, self.out)
        return y if self.bias is None else y + self.bias


class GraphSVD(nn.Module):
    """``y = (x · V) · Uᵀ + b`` from the two factors as stored: ``V`` as ``(in, rank)`` fp32, or ``Vᵀ`` as
    ``(rank, in)`` codes."""

    def __init__(self, layer: LowRankLinear) -> None:
        super().__init__()
        self.out = _factor(layer, "stored_out", None if layer.stored else layer.factor_out)
        if layer.factor_bits is None:
            self.inner = nn.Parameter(layer.factor_in.detach(), requires_grad=False)
        else:
            self.inner = _factor(layer, "stored_in", None if layer.stored else layer.factor_in.T)
        self.bias = _bias(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.inner.matmul_t(x) if isinstance(self.inner, GRAPH_MATRICES) else x @ self.inner
        y = _matmul_t(inner, self.out)
        return y if self.bias is None else y + self.bias


def _bits(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Bits packed 8 per byte, most significant first (``biprop.pack_bits``), unpacked in graph ops as float 0/1."""
    return unpack_codes(packed.reshape(1, -1), 1, numel).reshape(-1).float()


class GraphBiprop(nn.Module):
    """``y = x (α · sign ⊙ M)ᵀ`` from the packed mask bits and the packed sign bits (1 bit a weight each; the
    checkpoint regenerates the signs from ``sign_seed`` with a hash the graph does not carry), unpacked in the graph
    into the ternary weight before one ``MatMul``."""

    def __init__(self, layer: BipropLinear) -> None:
        super().__init__()
        if layer.trainable:
            layer._refresh_packed()
        self.shape = (layer.out_features, layer.in_features)
        self.register_buffer("mask_bits", layer.mask_bits.detach().clone())
        self.register_buffer("sign_bits", layer.sign_bits().detach().clone())
        self.register_buffer("alpha", layer.alpha.detach().float().clone())
        self.bias = _bias(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numel = self.shape[0] * self.shape[1]
        mask, sign = _bits(self.mask_bits, numel), _bits(self.sign_bits, numel)
        ternary = mask * (2 * sign - 1)
        y = x @ (ternary.reshape(self.shape) * self.alpha).T
        return y if self.bias is None else y + self.bias


def walsh_hadamard(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each block of ``block`` entries of ``x``'s last dimension times Sylvester's Hadamard matrix over √block, as
    log2(block) butterflies (sums and differences of halves): no ``block × block`` initializer in every layer."""
    y, half = x.reshape(-1, block), 1
    while half < block:
        pairs = y.reshape(-1, block // (2 * half), 2, half)
        low, high = pairs[:, :, 0], pairs[:, :, 1]
        y, half = torch.stack([low + high, low - high], dim=2).reshape(-1, block), half * 2
    return (y * block**-0.5).reshape(x.shape)


class GraphLowBitLinear(nn.Module):
    """``y = x Wᵀ + b`` on the full weight's packed codes: ``MatMulNBits`` where the width and groups map
    (``ortops.py``), else the codes decoded in the graph before one ``MatMul``. A rotated layer's inputs are first
    multiplied by its signs (unpacked in the graph from the stored bits) and ``walsh_hadamard``."""

    def __init__(self, layer: LowBitLinear) -> None:
        super().__init__()
        self.weight = graph_form(layer.packed())
        self.bias = _bias(layer)
        self.block = None if layer.rotation is None else layer.rotation.block
        if layer.rotation is not None:
            self.register_buffer("signs", layer.rotation.signs.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block is not None:  # a row of sign bits a block
            signs = unpack_codes(self.signs, 1, self.block).reshape(-1).float()
            x = walsh_hadamard(x * (2 * signs - 1), self.block)
        y = self.weight.matmul_t(x)
        return y if self.bias is None else y + self.bias


class GraphShared(nn.Module):
    """A shared Linear: the export form of the module it shares, whose initializers the graph then holds once
    (linked by ``link_shared`` once every layer has its export form)."""

    def __init__(self, layer: SharedLinear) -> None:
        super().__init__()
        self.source = layer.source
        object.__setattr__(self, "source_layer", None)  # a reference, not a submodule: the source's tensors once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.source_layer(x)


def link_shared(model: nn.Module) -> None:
    """Point every ``GraphShared`` of ``model`` at the export form (or dense Linear) its source now is."""
    for module in model.modules():
        if isinstance(module, GraphShared):
            object.__setattr__(module, "source_layer", model.get_submodule(module.source))


GRAPH_FORMS: dict[type, type[nn.Module]] = {
    CPLinear: GraphCP,
    LowRankLinear: GraphSVD,
    BipropLinear: GraphBiprop,
    LowBitLinear: GraphLowBitLinear,
    SharedLinear: GraphShared,
}
