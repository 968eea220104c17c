"""CP-decomposed linear projection (Smartformer's CPAC-Attention).

This file ships inside every saved checkpoint (``trust_remote_code``): it imports torch only.
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

#: Two thin matmuls plus the Khatri-Rao product run below the speed of one square matmul of equal multiply-adds
#: (measured by benchmarks/cp_layer.py); the factorized path is taken only when it wins by at least this factor.
FACTORIZED_OVERHEAD = 1.3


def khatri_rao(heads: torch.Tensor, head_dim: torch.Tensor) -> torch.Tensor:
    """Column-wise Kronecker product (h, R) ⊙ (d, R) -> (h·d, R), rows ordered as ``x.view(h, d)`` flattens."""
    return (heads[:, None, :] * head_dim[None, :, :]).reshape(-1, heads.shape[1])


def cp_reconstruct(factors: list[torch.Tensor]) -> torch.Tensor:
    """Σ_r a_r ∘ b_r ∘ c_r for three factor matrices."""
    a, b, c = factors
    return torch.einsum("ir,jr,kr->ijk", a, b, c)


def cp_als(
    tensor: torch.Tensor, factors: list[torch.Tensor], n_iter: int, tol: float = 1e-7
) -> tuple[list[torch.Tensor], float]:
    """Alternating least squares for a 3-way CP model, starting from ``factors``.

    Written in torch (not tensorly) because this file runs inside saved checkpoints, where only torch is
    guaranteed, and because the rank search calls it inside the training loop. Returns the factors and the
    relative reconstruction error.
    """
    factors = [f.clone() for f in factors]
    unfoldings = [torch.movedim(tensor, mode, 0).reshape(tensor.shape[mode], -1) for mode in range(3)]
    norm = tensor.norm().clamp_min(1e-30)
    previous_error = math.inf
    error = math.inf
    for _ in range(n_iter):
        for mode in range(3):
            others = [factors[m] for m in range(3) if m != mode]
            gram = (others[0].T @ others[0]) * (others[1].T @ others[1])
            kr = khatri_rao(others[0], others[1])
            rhs = unfoldings[mode] @ kr
            ridge = 1e-10 * gram.diagonal().mean().clamp_min(1e-30)
            gram = gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
            factors[mode] = torch.linalg.solve(gram, rhs.T).T
        error = float((tensor - cp_reconstruct(factors)).norm() / norm)
        if abs(previous_error - error) < tol:
            break
        previous_error = error
    return factors, error


def _balance(factors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Give the three factors of every component the same column norm, so none dominates the gradients.

    Components with an all-zero factor (fresh components from ``set_rank``) are left as they are.
    """
    norms = torch.stack([f.norm(dim=0) for f in factors])
    live = (norms > 0).all(dim=0)
    scale = torch.where(live, norms.prod(dim=0) ** (1.0 / 3.0), torch.ones_like(norms[0]))
    return [f * torch.where(live, scale / n.clamp_min(1e-30), torch.ones_like(n)) for f, n in zip(factors, norms)]


class CPLinear(CompressedLinear):
    """``y = x Wᵀ + b`` with ``Wᵀ`` folded to (heads, head_dim, out) and stored as rank-R CP factors.

    Parameters ``R·(h + d + out)`` instead of ``h·d·out`` (paper Table 1). Forward picks, for the input at hand,
    the cheaper of the factorized product ``(x · KhatriRao(A, B)) · Cᵀ`` and "rebuild W, then one matmul"; under
    ``torch.no_grad`` the rebuilt weight is cached until a factor changes.

    ``factor_bits``: the factors are stored as packed codes of that many bits (``runtime/factor_storage``): trained
    rounded as stored, saved as codes; ``stored=True`` is the form such a checkpoint loads as (codes only, and
    always the factorized path, so no float copy of the weight is ever kept).
    """

    layer_type = "cp"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_heads: int,
        rank: int,
        bias: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        factor_bits: int | str | None = None,
        factor_group_size: int | None = None,
        stored: bool = False,
    ) -> None:
        super().__init__()
        if stored and factor_bits is None:
            raise ValueError("stored=True is the form of a layer with low-bit factors; pass factor_bits")
        if num_heads <= 0 or in_features % num_heads:
            raise ValueError(f"in_features={in_features} is not divisible by num_heads={num_heads}")
        if rank < 1:
            raise ValueError(f"CP rank must be >= 1, got {rank}")
        self.in_features, self.out_features, self.num_heads = in_features, out_features, num_heads
        self.head_dim = in_features // num_heads
        self.factor_bits, self.factor_group_size, self.stored = factor_bits, factor_group_size, stored
        kwargs = {"device": device, "dtype": dtype}
        self._weight_cache: tuple[tuple, torch.Tensor] | None = None
        if stored:
            for name, rows in zip(STORED_NAMES, (num_heads, self.head_dim, out_features)):
                setattr(self, name, stored_form((rows, rank), factor_bits, factor_group_size))
            self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
            return
        self.factor_heads = nn.Parameter(torch.empty(num_heads, rank, **kwargs))
        self.factor_head_dim = nn.Parameter(torch.empty(self.head_dim, rank, **kwargs))
        self.factor_out = nn.Parameter(torch.empty(out_features, rank, **kwargs))
        self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
        if factor_bits is not None:
            self.register_state_dict_post_hook(_store_factors)
        self.reset_parameters()

    # ----------------------------------------------------------------- construction
    @property
    def rank(self) -> int:
        return self.stored_heads.shape[1] if self.stored else self.factor_heads.shape[1]

    def reset_parameters(self) -> None:
        """Random init whose rebuilt weight has the variance of ``nn.Linear``'s default init."""
        # Var(W) = R · Πσ²  ->  choose σ = (1 / (3·in·R))^(1/6) for each factor.
        std = (1.0 / (3.0 * self.in_features * self.rank)) ** (1.0 / 6.0)
        with torch.no_grad():
            for factor in self.factors:
                nn.init.normal_(factor, 0.0, std)
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_features)
                nn.init.uniform_(self.bias, -bound, bound)
        self._weight_cache = None

    @property
    def factors(self) -> list[nn.Parameter]:
        if self.stored:
            raise ValueError(
                "this layer was loaded with low-bit factors: it has codes (used_factors()), no fp32 factors"
            )
        return [self.factor_heads, self.factor_head_dim, self.factor_out]

    def used_factors(self, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """The factors the forward computes with: fp32, rounded as stored (``factor_bits``), or decoded codes. The
        codes hold no float dtype of their own, so they decode to ``dtype``: the forward passes its input's (a bf16
        model without biases, as Llama's projections are, computes in bf16), else the bias's, else fp32."""
        if self.stored:
            if dtype is None:
                dtype = self.bias.dtype if self.bias is not None else torch.float32
            return [getattr(self, name).dequantize(dtype) for name in STORED_NAMES]
        if self.factor_bits is None:
            return self.factors
        return [rounded(f, self.factor_bits, self.factor_group_size) for f in self.factors]

    def spec(self) -> dict:
        """Everything needed to rebuild an empty layer of this shape (stored in ``config.compression_config``)."""
        spec = {**super().spec(), "num_heads": self.num_heads, "rank": self.rank}
        return spec | storage_spec(self.factor_bits, self.factor_group_size)

    @classmethod
    def from_spec(cls, spec: dict) -> CPLinear:
        """The layer as a checkpoint holds it: with ``factor_bits``, the stored (inference-only) form."""
        sizes = (spec["in_features"], spec["out_features"], spec["num_heads"], spec["rank"], spec["bias"])
        return cls(*sizes, **storage_arguments(spec))

    def set_factor_bits(self, bits: int | str | None, group_size: int | None = None) -> None:
        """Store (and compute with) the factors in ``bits`` from now on (``None``: fp32); re-record the spec in the
        model's compression_config afterwards."""
        if self.stored:
            raise ValueError("this layer was loaded with low-bit factors; its fp32 factors are gone")
        if bits is not None and self.factor_bits is None:
            self.register_state_dict_post_hook(_store_factors)
        self.factor_bits, self.factor_group_size = bits, group_size
        self._weight_cache = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """The fp32 form reads low-bit codes too (its own ``state_dict``): the factors become the stored values."""
        if not self.stored and self.factor_bits is not None:
            for name, parameter in zip(STORED_NAMES, ("factor_heads", "factor_head_dim", "factor_out")):
                factor = getattr(self, parameter)
                values = read_codes(
                    state_dict,
                    prefix,
                    name,
                    tuple(factor.shape),
                    self.factor_bits,
                    self.factor_group_size,
                    factor.dtype,
                )
                if values is not None:
                    state_dict[prefix + parameter] = values
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def folded_weight(self, weight: torch.Tensor | None = None) -> torch.Tensor:
        """A dense ``(out, in)`` weight folded to the (heads, head_dim, out) tensor this layer factorizes."""
        weight = self.weight if weight is None else weight
        return weight.T.reshape(self.num_heads, self.head_dim, self.out_features)

    def load_factors(self, factors: list[torch.Tensor]) -> None:
        """Replace the factors (any rank) by new parameters; the optimizer must be told (see ``set_rank``)."""
        factors = _balance([f.detach() for f in factors])
        for name, value in zip(("factor_heads", "factor_head_dim", "factor_out"), factors):
            old = getattr(self, name)
            setattr(self, name, nn.Parameter(value.to(old.device, old.dtype).contiguous(), old.requires_grad))
        self._weight_cache = None

    # ----------------------------------------------------------------- rank change
    @torch.no_grad()
    def set_rank(self, rank: int, n_iter: int = 12) -> dict[nn.Parameter, nn.Parameter]:
        """Change the rank, warm-started from the current factors.

        Shrinking keeps the strongest components, then a few ALS sweeps refit them to the tensor the current
        factors represent. Growing cannot add information to that tensor (it already has rank ≤ the old rank),
        so it appends components whose output factor is zero, LoRA-style: the layer's function is unchanged
        and the new components receive gradients from the first step. The factors become *new* Parameters,
        so an optimizer built before the call would keep updating the old ones (the bug in the paper's code):
        pass the returned ``{old: new}`` map to ``hf_tensorcompress.replace_parameters_in_optimizer`` or
        rebuild the optimizer.
        """
        if rank < 1:
            raise ValueError(f"CP rank must be >= 1, got {rank}")
        old_params = self.factors
        if rank == self.rank:
            return {p: p for p in old_params}
        factors = [f.detach() for f in old_params]
        if rank < self.rank:
            work = [f.double() for f in factors]
            strength = torch.stack([f.norm(dim=0) for f in work]).prod(dim=0)
            keep = strength.argsort(descending=True)[:rank]
            new_factors, _ = cp_als(cp_reconstruct(work), [f[:, keep] for f in work], n_iter=n_iter)
        else:
            extra = rank - self.rank
            generator = torch.Generator(device="cpu").manual_seed(self.rank * 7919 + rank)
            std = (1.0 / (3.0 * self.in_features * rank)) ** (1.0 / 6.0)
            grown = [torch.randn(f.shape[0], extra, generator=generator).to(f) * std for f in factors[:2]] + [
                factors[2].new_zeros(factors[2].shape[0], extra)
            ]
            new_factors = [torch.cat([f, g], dim=1) for f, g in zip(factors, grown)]
        self.load_factors(new_factors)
        return dict(zip(old_params, self.factors))

    # ----------------------------------------------------------------- forward
    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(out, in)`` weight these factors represent (rebuilt on every access)."""
        heads, head_dim, out = self.used_factors()
        return out @ khatri_rao(heads, head_dim).T

    def _cached_weight(self) -> torch.Tensor:
        key = tuple((f.data_ptr(), f._version) for f in self.factors) + (self.factor_bits,)
        if self._weight_cache is None or self._weight_cache[0] != key:
            self._weight_cache = (key, self.weight.detach())
        return self._weight_cache[1]

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        """Multiply-adds of the cheaper forward path for ``tokens`` input rows, and that path's name."""
        rank, fan_in, fan_out = self.rank, self.in_features, self.out_features
        factorized = tokens * rank * (fan_in + fan_out) + fan_in * rank
        if self.factor_bits is not None:  # low-bit factors: never a float copy of the weight (the stored form's path)
            return factorized, "factorized"
        dense = tokens * fan_in * fan_out + (0 if cached else fan_in * rank * fan_out + fan_in * rank)
        return (factorized, "factorized") if FACTORIZED_OVERHEAD * factorized <= dense else (dense, "reconstruct")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // self.in_features
        cached = not torch.is_grad_enabled()
        _, path = self.multiply_adds(tokens, cached=cached)
        if path == "factorized":
            heads, head_dim, out = self.used_factors(x.dtype)
            return F.linear(x @ khatri_rao(heads, head_dim), out, self.bias)
        weight = self._cached_weight() if cached else self.weight
        return F.linear(x, weight, self.bias)

    def storage_bits(self) -> int:
        """fp32 factors and bias, or the packed codes, scales and minima of the low-bit factors plus the bias."""
        if self.factor_bits is None:
            return super().storage_bits()
        shapes = ((self.num_heads, self.rank), (self.head_dim, self.rank), (self.out_features, self.rank))
        forms = (
            [getattr(self, name) for name in STORED_NAMES]
            if self.stored
            else [stored_form(shape, self.factor_bits, self.factor_group_size) for shape in shapes]
        )
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size() * 8
        return sum(form.storage_bits() for form in forms) + bias

    def extra_repr(self) -> str:
        bits = "" if self.factor_bits is None else f", factor_bits={self.factor_bits}, stored={self.stored}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, heads={self.num_heads}, "
            f"rank={self.rank}, bias={self.bias is not None}{bits}"
        )


#: Names of the three factors' codes in a checkpoint (heads, head_dim, out).
STORED_NAMES = ("stored_heads", "stored_head_dim", "stored_out")


def _store_factors(module: CPLinear, state_dict: dict, prefix: str, local_metadata) -> None:
    """A layer with low-bit factors saves what its stored form loads: the codes, not the fp32 factors."""
    if module.factor_bits is None or module.stored:
        return
    factors = {
        name: (parameter, getattr(module, parameter))
        for name, parameter in zip(STORED_NAMES, ("factor_heads", "factor_head_dim", "factor_out"))
    }
    save_codes(state_dict, prefix, factors, module.factor_bits, module.factor_group_size)
