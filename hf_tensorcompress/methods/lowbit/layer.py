"""Full-rank low-bit Linear: the whole ``out × in`` weight, stored as packed codes with a scale per group.

A layer being trained keeps an fp32 ``latent`` weight and computes with it rounded exactly as it will be stored
(straight-through gradients: quantization-aware training); its ``state_dict`` holds only the codes, which it also
reads back (a kept best checkpoint, a Trainer resume). A checkpoint loads as the stored form: a ``LowBitTensor`` (a
``TernaryTensor``, five codes a byte, for ternary weights) whose codes stay packed in memory, multiplied a chunk of
rows at a time (or by the fused kernel for a few vectors), giving the outputs the trained layer gave. The packing and
the rounding are the runtime's (``factor_storage``: the same widths as the low-rank layers' factors, ternary
included).

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...runtime.contract import CompressedLinear
from ...runtime.factor_storage import read_codes, rounded, save_codes, stored, stored_form
from ...runtime.lowbit import StoredMatrix


class LowBitLinear(CompressedLinear):
    """``y = x Q(W)ᵀ + b``, ``Q`` the rounding to ``bits`` per group of ``group_size`` input columns.

    ``stored=True`` builds the inference-only form a checkpoint loads as (``LowBitTensor`` codes, no fp32 weight).
    """

    layer_type = "lowbit"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int | str,
        group_size: int | None = 32,
        bias: bool = True,
        stored: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size, self.stored = bits, group_size, stored
        kwargs = {"device": device, "dtype": dtype}
        if stored:
            self.stored_weight = stored_form((out_features, in_features), bits, group_size)
        else:
            self.latent = nn.Parameter(torch.empty(out_features, in_features, **kwargs))
            self.register_state_dict_post_hook(_store_weight)
        self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
        self._cache: tuple[tuple, StoredMatrix] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s init (the stored form: that init, rounded); nothing to fill on the meta device."""
        weight = self.stored_weight.codes if self.stored else self.latent
        if weight.is_meta:
            return
        fresh = torch.empty(self.out_features, self.in_features, device=weight.device)
        nn.init.kaiming_uniform_(fresh, a=math.sqrt(5))
        with torch.no_grad():
            if self.stored:
                self.stored_weight.copy_(stored(fresh, self.bits, self.group_size))
            else:
                self.latent.copy_(fresh)
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_features)
                nn.init.uniform_(self.bias, -bound, bound)

    def spec(self) -> dict:
        return {**super().spec(), "bits": self.bits, "group_size": self.group_size}

    @classmethod
    def from_spec(cls, spec: dict) -> LowBitLinear:
        """The layer as a checkpoint holds it: the stored (inference-only) form."""
        sizes = (spec["in_features"], spec["out_features"], spec["bits"], spec["group_size"])
        return cls(*sizes, bias=spec["bias"], stored=True)

    def set_bits(self, bits: int | str, group_size: int | None = None) -> None:
        """Store (and compute with) the weight in ``bits`` from now on: the same parameter, rounded another way (a
        search switching widths, or rounding after training). Re-record the spec in the model's compression_config
        afterwards."""
        if self.stored:
            raise ValueError("this layer was loaded with packed codes; its fp32 weight is gone")
        self.bits, self.group_size = bits, group_size

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """The trainable form reads codes too (its own ``state_dict``): the weight becomes the stored values, which
        round to themselves."""
        if not self.stored:
            shape = (self.out_features, self.in_features)
            values = read_codes(
                state_dict, prefix, "stored_weight", shape, self.bits, self.group_size, self.latent.dtype
            )
            if values is not None:
                state_dict[prefix + "latent"] = values
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def weight(self) -> torch.Tensor:
        """The weight the forward computes with (the trainable form: with straight-through gradients)."""
        if self.stored:
            return self.stored_weight.dequantize()
        return rounded(self.latent, self.bits, self.group_size)

    def dense_weight(self) -> torch.Tensor:
        with torch.no_grad():
            return self.weight

    def packed(self) -> StoredMatrix:
        """The weight as a checkpoint stores it: the loaded codes, or the trainable weight's codes, cached until
        the weight or its width changes (evaluation runs the loaded form's product on them)."""
        if self.stored:
            return self.stored_weight
        key = (self.latent.data_ptr(), self.latent._version, self.latent.device, self.bits, self.group_size)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, stored(self.latent, self.bits, self.group_size))
        return self._cache[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Training: the rounded weight with straight-through gradients. Without gradients (evaluation, a loaded
        checkpoint): the packed codes' own product, so a trained layer scores exactly as it will once loaded."""
        if not self.stored and torch.is_grad_enabled() and (self.latent.requires_grad or x.requires_grad):
            output = x @ self.weight.T
        else:
            output = self.packed().matmul_t(x)
        return output if self.bias is None else output + self.bias

    def stored_parameters(self) -> int:
        return self.in_features * self.out_features + (0 if self.bias is None else self.out_features)

    def storage_bits(self) -> int:
        """The packed codes, scales and minima of the weight, plus the bias."""
        codes = (
            self.stored_weight
            if self.stored
            else stored_form((self.out_features, self.in_features), self.bits, self.group_size)
        )
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size() * 8
        return codes.storage_bits() + bias

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        return tokens * self.in_features * self.out_features, "lowbit"

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, stored={self.stored}"
        )


def _store_weight(module: LowBitLinear, state_dict: dict, prefix: str, local_metadata) -> None:
    """The trainable form saves what the stored form loads: the codes, not the fp32 weight."""
    if module.stored:
        return
    save_codes(state_dict, prefix, {"stored_weight": ("latent", module.latent)}, module.bits, module.group_size)
