"""Truncated-SVD linear projection: the "SVD-Smartformer" baseline, with fp32 or low-bit factors.

With ``factor_bits`` the factors ``U`` and ``Vᵀ`` are stored as packed integer codes (``LowBitTensor``). A layer
being trained keeps fp32 factors and computes with them rounded exactly as they will be stored (straight-through
gradients); its ``state_dict`` holds only the codes. A checkpoint loads as the stored form: the codes stay packed
in memory and the forward decodes one factor at a time (never the ``out × in`` weight), giving the outputs the
trained layer gave.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.contract import CompressedLinear
from ...runtime.factor_storage import (
    read_codes,
    rounded,
    save_codes,
    storage_arguments,
    storage_spec,
    stored_form,
)


def truncated_svd(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``W ≈ U Vᵀ`` with the singular values split evenly (√σ on each side), so both factors train alike."""
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).to(weight.dtype), (vh[:rank].T * root).to(weight.dtype)


class LowRankLinear(CompressedLinear):
    """``y = x (U Vᵀ)ᵀ + b`` with ``U ∈ R^{out×R}``, ``V ∈ R^{in×R}``: ``R·(in + out)`` parameters.

    ``factor_bits``: factors stored as codes of that many bits (module docstring); ``stored=True`` builds the
    inference-only form a checkpoint with low-bit factors loads as (``LowBitTensor`` codes, no fp32 factors).
    """

    layer_type = "svd"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        bias: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        factor_bits: int | str | None = None,
        factor_group_size: int | None = None,
        stored: bool = False,
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"SVD rank must be >= 1, got {rank}")
        if stored and factor_bits is None:
            raise ValueError("stored=True is the form of a layer with low-bit factors; pass factor_bits")
        self.in_features, self.out_features = in_features, out_features
        self.factor_bits, self.factor_group_size, self.stored = factor_bits, factor_group_size, stored
        kwargs = {"device": device, "dtype": dtype}
        if stored:
            self.stored_out = stored_form((out_features, rank), factor_bits, factor_group_size)
            self.stored_in = stored_form((rank, in_features), factor_bits, factor_group_size)
        else:
            self.factor_out = nn.Parameter(torch.empty(out_features, rank, **kwargs))
            self.factor_in = nn.Parameter(torch.empty(in_features, rank, **kwargs))
            if factor_bits is not None:
                self.register_state_dict_post_hook(_store_factors)
        self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
        if not stored:
            self.reset_parameters()

    @property
    def rank(self) -> int:
        return self.stored_in.shape[0] if self.stored else self.factor_in.shape[1]

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
        return {**super().spec(), "rank": self.rank} | storage_spec(self.factor_bits, self.factor_group_size)

    @classmethod
    def from_spec(cls, spec: dict) -> LowRankLinear:
        """The layer as a checkpoint holds it: with ``factor_bits``, the stored (inference-only) form."""
        sizes = (spec["in_features"], spec["out_features"], spec["rank"], spec["bias"])
        return cls(*sizes, **storage_arguments(spec))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """The fp32 form reads low-bit codes too (its own ``state_dict``, e.g. a kept best checkpoint or a Trainer
        resume): the factors become the stored values, which round to themselves."""
        if not self.stored and self.factor_bits is not None:
            dtype = self.factor_out.dtype
            out_t = read_codes(
                state_dict,
                prefix,
                "stored_out",
                (self.out_features, self.rank),
                self.factor_bits,
                self.factor_group_size,
                dtype,
            )
            in_t = read_codes(
                state_dict,
                prefix,
                "stored_in",
                (self.rank, self.in_features),
                self.factor_bits,
                self.factor_group_size,
                dtype,
            )
            if out_t is not None and in_t is not None:
                state_dict[prefix + "factor_out"], state_dict[prefix + "factor_in"] = out_t, in_t.T
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def set_factor_bits(self, bits: int | str | None, group_size: int | None = None) -> None:
        """Store (and compute with) the factors in ``bits`` from now on (``None``: fp32): post-training rounding,
        or a switch during training. Re-record the spec in the model's compression_config afterwards."""
        if self.stored:
            raise ValueError("this layer was loaded with low-bit factors; its fp32 factors are gone")
        if bits is not None and self.factor_bits is None:
            self.register_state_dict_post_hook(_store_factors)
        self.factor_bits, self.factor_group_size = bits, group_size

    def rounded_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U, Vᵀ)`` as the forward uses them: stored values with straight-through gradients to the fp32 factors."""
        out_t, in_t = self.factor_out, self.factor_in.T
        if self.factor_bits is None:
            return out_t, in_t
        return rounded(out_t, self.factor_bits, self.factor_group_size), rounded(
            in_t, self.factor_bits, self.factor_group_size
        )

    @property
    def weight(self) -> torch.Tensor:
        if self.stored:
            return self.stored_out.dequantize() @ self.stored_in.dequantize()
        return self.factor_out @ self.factor_in.T

    def dense_weight(self) -> torch.Tensor:
        """The weight the forward computes (``decompress``): with low-bit factors, the product of the rounded ones
        (``weight`` is the fp32 factors' product, which ``set_rank`` re-truncates)."""
        if self.stored or self.factor_bits is None:
            return self.weight
        out_t, in_t = self.rounded_factors()
        return out_t @ in_t

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
        if self.stored:  # decode one factor at a time: hidden = x V, then hidden Uᵀ
            output = self.stored_out.matmul_t(self.stored_in.matmul_t(x))
            return output if self.bias is None else output + self.bias
        if self.factor_bits is not None:  # the same products on the values the stored form decodes to
            out_t, in_t = self.rounded_factors()
            output = (x @ in_t.T) @ out_t.T
            return output if self.bias is None else output + self.bias
        if self.multiply_adds(1)[1] == "reconstruct":
            return F.linear(x, self.weight, self.bias)
        return F.linear(x @ self.factor_in, self.factor_out, self.bias)

    def storage_bits(self) -> int:
        """fp32 factors and bias, or the packed codes, scales and minima of the low-bit factors plus the bias."""
        if self.factor_bits is None:
            return super().storage_bits()
        if self.stored:
            stored = [self.stored_out, self.stored_in]
        else:
            shapes = ((self.out_features, self.rank), (self.rank, self.in_features))
            stored = [stored_form(shape, self.factor_bits, self.factor_group_size) for shape in shapes]
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size() * 8
        return sum(s.storage_bits() for s in stored) + bias

    def extra_repr(self) -> str:
        bits = "" if self.factor_bits is None else f", factor_bits={self.factor_bits}, stored={self.stored}"
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}{bits}"


def _store_factors(module: LowRankLinear, state_dict: dict, prefix: str, local_metadata) -> None:
    """A layer with low-bit factors saves what its stored form loads: the codes, not the fp32 factors."""
    if module.factor_bits is None or module.stored:
        return
    factors = {"stored_out": ("factor_out", module.factor_out), "stored_in": ("factor_in", module.factor_in.T)}
    save_codes(state_dict, prefix, factors, module.factor_bits, module.factor_group_size)
