"""Truncated-SVD linear projection: the "SVD-Smartformer" baseline.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...core.contract import CompressedLinear


def truncated_svd(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``W ≈ U Vᵀ`` with the singular values split evenly (√σ on each side), so both factors train alike."""
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).to(weight.dtype), (vh[:rank].T * root).to(weight.dtype)


class LowRankLinear(CompressedLinear):
    """``y = x (U Vᵀ)ᵀ + b`` with ``U ∈ R^{out×R}``, ``V ∈ R^{in×R}``: ``R·(in + out)`` parameters."""

    layer_type = "svd"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        bias: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"SVD rank must be >= 1, got {rank}")
        self.in_features, self.out_features = in_features, out_features
        kwargs = {"device": device, "dtype": dtype}
        self.factor_out = nn.Parameter(torch.empty(out_features, rank, **kwargs))
        self.factor_in = nn.Parameter(torch.empty(in_features, rank, **kwargs))
        self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
        self.reset_parameters()

    @property
    def rank(self) -> int:
        return self.factor_in.shape[1]

    @property
    def factors(self) -> list[nn.Parameter]:
        return [self.factor_out, self.factor_in]

    def reset_parameters(self) -> None:
        """Random init whose product has the variance of ``nn.Linear``'s default init."""
        std = (1.0 / (3.0 * self.in_features * self.rank)) ** 0.25
        with torch.no_grad():
            nn.init.normal_(self.factor_out, 0.0, std)
            nn.init.normal_(self.factor_in, 0.0, std)
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_features)
                nn.init.uniform_(self.bias, -bound, bound)

    def spec(self) -> dict:
        return {**super().spec(), "rank": self.rank}

    @classmethod
    def from_spec(cls, spec: dict) -> "LowRankLinear":
        return cls(spec["in_features"], spec["out_features"], spec["rank"], spec["bias"])

    @property
    def weight(self) -> torch.Tensor:
        return self.factor_out @ self.factor_in.T

    def load_factors(self, factors: list[torch.Tensor]) -> None:
        for name, value in zip(("factor_out", "factor_in"), factors):
            old = getattr(self, name)
            setattr(self, name, nn.Parameter(value.detach().to(old.device, old.dtype).contiguous(), old.requires_grad))

    @torch.no_grad()
    def set_rank(self, rank: int, n_iter: int | None = None) -> dict[nn.Parameter, nn.Parameter]:
        """Re-truncate the current product at ``rank`` (exact best approximation, so no warm start is needed and
        ``n_iter``, the refit sweeps of an iterative layer, is not used).

        Returns ``{old: new}`` parameters for ``replace_parameters_in_optimizer``.
        """
        if rank < 1:
            raise ValueError(f"SVD rank must be >= 1, got {rank}")
        old_params = self.factors
        if rank == self.rank:
            return {p: p for p in old_params}
        limit = min(self.in_features, self.out_features)
        u, v = truncated_svd(self.weight, min(rank, limit))
        if rank > limit:  # pad with zero components so the shape matches the requested rank
            u = torch.cat([u, u.new_zeros(u.shape[0], rank - limit)], dim=1)
            v = torch.cat([v, v.new_zeros(v.shape[0], rank - limit)], dim=1)
        self.load_factors([u, v])
        return dict(zip(old_params, self.factors))

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        """Multiply-adds of the forward path for ``tokens`` input rows, and that path's name."""
        fan_in, fan_out = self.in_features, self.out_features
        if self.rank * (fan_in + fan_out) >= fan_in * fan_out:
            return tokens * fan_in * fan_out + (0 if cached else fan_in * fan_out * self.rank), "reconstruct"
        return tokens * self.rank * (fan_in + fan_out), "factorized"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.multiply_adds(1)[1] == "reconstruct":
            return F.linear(x, self.weight, self.bias)
        return F.linear(x @ self.factor_in, self.factor_out, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"
