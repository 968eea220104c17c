"""The ``vq-<dim>-<bits>`` arm: every Linear's weight as vector-quantized codes, trained so from the first step.

Below 2 bits a weight, scalar codes leave little room (ternary is 1.58 bits); vector quantization, the field's answer
there (AQLM, Egiazarian et al., 2024; QuIP#, Tseng et al., 2024), spends the bits on ``dim`` weights at once. Each run of
``dim`` consecutive weights of a row, divided by the row's RMS, is stored as the index of its nearest entry in a
codebook of ``2**bits`` vectors learned with the layer: ``bits / dim`` bits a weight, plus the codebook and a scale a
row, in fp16. The codebook starts as k-means of the initial weights; training moves the fp32 latent weights
straight-through the nearest-entry choice, and the codebook by the gradient of the entries chosen. Hand-written: no
dependency of this project trains vector-quantized weights (AQLM's package quantizes a trained LLM layer by layer; it
does not train a model's Linears so from the first step)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hf_tensorcompress.runtime.factor_storage import fp16_rounded

from .arm_names import VQ_ARM
from .byte_arms import stored_in_fp16_bias
from .costs import scope_names

#: Lloyd iterations of the codebook's k-means start.
KMEANS_STEPS = 20


def vq_arm(name: str) -> tuple[int, int] | None:
    """(weights a vector, bits an index) of a ``vq-<dim>-<bits>`` arm name, or None."""
    match = VQ_ARM.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def row_scale(weight: torch.Tensor) -> torch.Tensor:
    """Each row's RMS as fp16 stores it (no gradient: it follows the latent weight), ``(rows, 1)``."""
    return weight.detach().pow(2).mean(1, keepdim=True).sqrt().clamp_min(1e-8).half().float()


def nearest(vectors: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of each vector's nearest codebook entry (squared distance)."""
    distances = vectors.pow(2).sum(1, keepdim=True) - 2 * vectors @ codebook.T + codebook.pow(2).sum(1)
    return distances.argmin(1)


def kmeans(vectors: torch.Tensor, entries: int, generator: torch.Generator) -> torch.Tensor:
    """``entries`` centroids of ``vectors`` after ``KMEANS_STEPS`` Lloyd steps from a random draw of them (an entry
    left empty keeps its place)."""
    entries = min(entries, len(vectors))
    centroids = vectors[torch.randperm(len(vectors), generator=generator)[:entries]].clone()
    for _ in range(KMEANS_STEPS):
        chosen = nearest(vectors, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, chosen, vectors)
        counts = torch.bincount(chosen, minlength=entries).unsqueeze(1)
        centroids = torch.where(counts > 0, sums / counts.clamp_min(1), centroids)
    return centroids


class VectorCodes(torch.nn.Module):
    """A weight as its rows' scales times codebook entries, a ``dim``-weight run of a row each, straight-through to
    the fp32 latent weight; the codebook (fp16 as stored) is a trained parameter."""

    def __init__(self, weight: torch.Tensor, dim: int, bits: int, generator: torch.Generator) -> None:
        super().__init__()
        if weight.shape[1] % dim:
            raise ValueError(f"vq-{dim}-{bits}: a weight of {weight.shape[1]} columns is not a whole number of runs")
        self.dim = dim
        with torch.no_grad():
            vectors = (weight / row_scale(weight)).reshape(-1, dim)
            self.codebook = torch.nn.Parameter(kmeans(vectors, 2**bits, generator))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        scale = row_scale(weight)
        vectors = (weight / scale).reshape(-1, self.dim)
        codebook = fp16_rounded(self.codebook)
        chosen = codebook[nearest(vectors.detach(), codebook.detach())]
        return scale * (chosen + vectors - vectors.detach()).reshape(weight.shape)


def vq_bits(rows: int, columns: int, dim: int, bits: int) -> int:
    """Stored bits of a ``rows × columns`` weight as ``vq-<dim>-<bits>``: the indices, the fp16 codebook, an fp16
    scale a row."""
    return rows * columns // dim * bits + min(2**bits, rows * columns // dim) * dim * 16 + rows * 16


def prepare_vq(dim: int, bits: int) -> Callable:
    """An arm's ``prepare``: every Linear's weight as ``vq-<dim>-<bits>`` codes (``VectorCodes``), its bias in
    fp16; returns their disk bytes."""

    def prepare(model: torch.nn.Module, final_ranks) -> dict[str, int]:
        generator = torch.Generator().manual_seed(0)
        packed = {}
        for name in scope_names(model, "all"):
            module = model.get_submodule(name)
            codes = VectorCodes(module.weight.detach(), dim, bits, generator)
            stored_bits = vq_bits(module.out_features, module.in_features, dim, bits)
            packed[name] = stored_in_fp16_bias(module, codes, stored_bits)
        return packed

    return prepare
