"""TensorSLM figures: compression ratios (paper Eq. 21, η_TTD), inference-energy estimates (Eq. 2-5) and the
matrix-SVD embedding baseline at a given parameter budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...core.metrics import NU_OVER_TAU


def compression_ratio(dense_params: int, params: int) -> float:
    """``|M0| / |Mcmpr|`` (the "2×" figure). Paper Eq. 21's η is this minus one."""
    return dense_params / params


def eta(dense_params: int, params: int) -> float:
    """Paper Eq. 21, ``η = (|M0| − |Mcmpr|) / |Mcmpr|``; for one token, η_TTD = d / Σ_k r_{k-1} I_k r_k − 1."""
    return (dense_params - params) / params


@dataclass
class Energy:
    """Estimated energy of embedding ``length`` input tokens, in units of ν (one float32 memory access)."""

    memory: float
    compute: float

    @property
    def total(self) -> float:
        return self.memory + self.compute


def dense_energy(vocab: int, hidden: int, length: int) -> Energy:
    """Paper Eq. 2: ``E_ν = ν(dV + ld)``, ``E_τ = 0``."""
    return Energy(memory=hidden * vocab + length * hidden, compute=0.0)


def tt_energy(vocab: int, hidden: int, length: int, per_token: float) -> Energy:
    """Paper Eq. 3 with ``N I r²`` replaced by the measured parameters per token train ``Σ_k r_{k-1} I_k r_k``:
    ``E'_ν = ν(V·P + l·P + l·d)``, ``E'_τ = τ·P`` (the paper's compute term, taken as written)."""
    return Energy(memory=vocab * per_token + length * per_token + length * hidden, compute=per_token / NU_OVER_TAU)


def svd_energy(vocab: int, hidden: int, length: int, rank: int) -> Energy:
    """Paper Eq. 4-5: ``E''_ν = ν[k(V + 2d + l + 1) + ld]``, ``E''_τ = τ(2ldk − ld + kd)``."""
    memory = rank * (vocab + 2 * hidden + length + 1) + length * hidden
    return Energy(memory=memory, compute=(2 * length * hidden * rank - length * hidden + rank * hidden) / NU_OVER_TAU)


def energy_ratio(energy: Energy, dense: Energy) -> float:
    """ω = (E'_ν + E'_τ) / (E_ν + E_τ)."""
    return energy.total / dense.total


def svd_rank_for(vocab: int, hidden: int, params: int) -> int:
    """The largest SVD rank ``k`` whose factors ``k(V + d)`` fit in ``params``."""
    return max(1, params // (vocab + hidden))


@torch.no_grad()
def apply_svd_embedding(model: nn.Module, rank: int) -> int:
    """The matrix-SVD baseline: the input embedding (and a tied output layer with it) becomes its best rank-``k``
    approximation ``U_k S_k V_kᵀ``. The product is written back dense, which gives exactly the logits the factorized
    layer gives; returns the parameters ``k(V + d)`` the factorized form stores."""
    weight = model.get_input_embeddings().weight
    u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)
    weight.copy_(((u[:, :rank] * s[:rank]) @ vh[:rank]).to(weight.dtype))
    return rank * sum(weight.shape)


def energy_report(
    vocab: int, hidden: int, length: int, tt_per_token: float | None = None, svd_rank: int | None = None
) -> dict:
    """Energies (units of ν) and ratios ω against dense for a query of ``length`` tokens."""
    dense = dense_energy(vocab, hidden, length)
    report = {"dense": asdict(dense) | {"total": dense.total}}
    if tt_per_token is not None:
        tt = tt_energy(vocab, hidden, length, tt_per_token)
        report["tt"] = asdict(tt) | {"total": tt.total, "ratio": energy_ratio(tt, dense)}
    if svd_rank is not None:
        svd = svd_energy(vocab, hidden, length, svd_rank)
        report["svd"] = asdict(svd) | {"total": svd.total, "ratio": energy_ratio(svd, dense)}
    return report
