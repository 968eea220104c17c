"""Full-rank low-bit Linear: the whole ``out × in`` weight, stored as packed codes with a scale per group.

A layer being trained keeps an fp32 ``latent`` weight and computes with it rounded exactly as it will be stored
(straight-through gradients: quantization-aware training); its ``state_dict`` holds only the codes, which it also
reads back (a kept best checkpoint, a Trainer resume). A checkpoint loads as the stored form: a ``LowBitTensor`` (a
``TernaryTensor``, five codes a byte, for ternary weights) whose codes stay packed in memory, multiplied a chunk of
rows at a time (or by the fused kernel for a few vectors), giving the outputs the trained layer gave. The packing and
the rounding are the runtime's (``factor_storage``: the same widths as the low-rank layers' factors, ternary
included). With ``rotation_block`` the inputs are rotated first (``rotation.py``) and the weight is held in the
rotated basis.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...runtime.contract import CompressedLinear
from ...runtime.factor_storage import fp16_rounded, read_codes, rounded, save_codes, stored, stored_form
from ...runtime.lowbit import StoredMatrix
from .learned_scales import initial_scales, learned_stored, learned_values, scale_groups
from .rotation import InputRotation


class LowBitLinear(CompressedLinear):
    """``y = x Q(W)ᵀ + b``, ``Q`` the rounding to ``bits`` per group of ``group_size`` input columns.

    ``stored=True`` builds the inference-only form a checkpoint loads as (``LowBitTensor`` codes, no fp32 weight).
    ``learned_scales=True`` trains each group's scale (and minimum) as parameters ``scale`` and ``minimum`` rather
    than taking them from the weights at every step (``learned_scales.py``); the stored form is the same.
    ``half_bias=True`` stores the bias in fp16: the trainable form computes with it rounded so (straight-through) and
    saves it so, and the stored form holds it in fp16 whatever the model's dtype.
    ``rotation_block`` rotates the inputs by a Hadamard matrix, a block of that many at a time, before the weight
    (``rotation.py``; after random signs drawn from ``rotation_seed``, where one is given): the weight (``latent``,
    the codes) is then of the rotated basis.
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
        learned_scales: bool = False,
        half_bias: bool = False,
        rotation_block: int | None = None,
        rotation_seed: int | None = None,
    ) -> None:
        super().__init__()
        if learned_scales and (stored or bits == 16):
            raise ValueError(
                "learned_scales trains the scales of a layer being trained at 8, 4, 3, 2 bits, ternary or 1 bit; "
                f"this one is {'a loaded (stored) layer' if stored else 'bfloat16 (bits=16), which has no scales'}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size, self.stored, self.learned_scales = bits, group_size, stored, learned_scales
        self.half_bias = half_bias and bias
        kwargs = {"device": device, "dtype": dtype}
        self.rotation = (
            None if rotation_block is None else InputRotation(in_features, rotation_block, rotation_seed, device)
        )
        if stored:
            self.stored_weight = stored_form((out_features, in_features), bits, group_size)
        else:
            self.latent = nn.Parameter(torch.empty(out_features, in_features, **kwargs))
            if learned_scales:
                self._new_scales(**kwargs)
            self.register_state_dict_post_hook(_store_weight)
        if stored and self.half_bias:  # a buffer: ``model.dtype`` (its first float parameter) stays the model's
            self.register_buffer("bias", torch.zeros(out_features, device=device, dtype=torch.float16))
        else:
            self.bias = nn.Parameter(torch.zeros(out_features, **kwargs)) if bias else None
        self._cache: tuple[tuple, StoredMatrix] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s init (the stored form: that init, rounded); nothing to fill on the meta device."""
        weight = self.stored_weight.codes if self.stored else self.latent
        if weight.is_meta:
            return
        if self.rotation is not None:
            self.rotation.draw()
        fresh = torch.empty(self.out_features, self.in_features, device=weight.device)
        nn.init.kaiming_uniform_(fresh, a=math.sqrt(5))
        with torch.no_grad():
            if self.stored:
                self.stored_weight.copy_(stored(fresh, self.bits, self.group_size))
            else:
                self.latent.copy_(fresh)
                self.start_scales()
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_features)
                nn.init.uniform_(self.bias, -bound, bound)

    def _new_scales(self, **kwargs) -> None:
        """Fresh ``scale`` (ones) and ``minimum`` (zeros) parameters, one per group of the present width."""
        groups = self.in_features // scale_groups(self.bits, self.group_size, self.in_features)
        self.scale = nn.Parameter(torch.ones(self.out_features, groups, **kwargs))
        self.minimum = nn.Parameter(torch.zeros(self.out_features, groups, **kwargs))

    @torch.no_grad()
    def start_scales(self) -> None:
        """Learned scales: start from those the weight's present values give (after the weight was set)."""
        if self.learned_scales and not self.latent.is_meta:
            scale, minimum = initial_scales(self.latent, self.bits, self.group_size)
            self.scale.copy_(scale)
            self.minimum.copy_(minimum)

    def spec(self) -> dict:
        half = {"bias_dtype": "float16"} if self.half_bias else {}
        rotation = {} if self.rotation is None else {"rotation_block": self.rotation.block}
        return {**super().spec(), "bits": self.bits, "group_size": self.group_size, **half, **rotation}

    @classmethod
    def from_spec(cls, spec: dict) -> LowBitLinear:
        """The layer as a checkpoint holds it: the stored (inference-only) form."""
        sizes = (spec["in_features"], spec["out_features"], spec["bits"], spec["group_size"])
        half = spec.get("bias_dtype", "model") == "float16"
        rotation = spec.get("rotation_block")
        return cls(*sizes, bias=spec["bias"], stored=True, half_bias=half, rotation_block=rotation)

    def set_bits(self, bits: int | str, group_size: int | None = None) -> dict[nn.Parameter, nn.Parameter]:
        """Store (and compute with) the weight in ``bits`` from now on: the same parameter, rounded another way (a
        search switching widths, or rounding after training). Learned scales were learned for the old width: new
        ``scale`` and ``minimum`` parameters start from the weight's present values at the new one. Returns {old:
        new} parameters (for the optimizer); re-record the spec in the model's compression_config afterwards."""
        if self.stored:
            raise ValueError("this layer was loaded with packed codes; its fp32 weight is gone")
        if self.learned_scales and bits == 16:
            raise ValueError(
                "learned scales need 8, 4, 3, 2 bits, 'ternary' or 1 bit; bfloat16 (bits=16) has no scales"
            )
        same = (bits, group_size) == (self.bits, self.group_size)
        self.bits, self.group_size = bits, group_size
        if not self.learned_scales or same:  # the same width keeps what its scales learned
            return {}
        old = (self.scale, self.minimum)
        self._new_scales(device=self.latent.device, dtype=self.latent.dtype)
        self.start_scales()
        return dict(zip(old, (self.scale, self.minimum)))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """The trainable form reads codes too (its own ``state_dict``): the weight becomes the stored values, which
        round to themselves."""
        if not self.stored:
            shape = (self.out_features, self.in_features)
            if self.learned_scales and prefix + "stored_weight.scale" in state_dict:  # the learned scales as stored
                scale = state_dict[prefix + "stored_weight.scale"]
                state_dict[prefix + "scale"] = scale.float()
                minimum = state_dict.get(prefix + "stored_weight.minimum", torch.zeros_like(scale))  # none: ternary
                state_dict[prefix + "minimum"] = minimum.float()
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
        if self.learned_scales:
            return learned_values(self.latent, self.scale, self.minimum, self.bits, self.group_size)
        return rounded(self.latent, self.bits, self.group_size)

    def dense_weight(self) -> torch.Tensor:
        """The weight in the inputs' own basis (a rotated layer's ``weight`` is of the rotated one)."""
        with torch.no_grad():
            return self.weight if self.rotation is None else self.rotation.unrotate(self.weight)

    def latent_weight(self) -> torch.Tensor:
        """The trainable form's fp32 weight before rounding, in the inputs' own basis: what another form of the layer
        starts from."""
        with torch.no_grad():
            return self.latent if self.rotation is None else self.rotation.unrotate(self.latent)

    def dense_bias(self) -> torch.Tensor | None:
        """The bias the forward adds (fp16-rounded, straight-through, for a trainable ``half_bias`` layer)."""
        if self.bias is None or not self.half_bias or self.stored:
            return self.bias
        return fp16_rounded(self.bias)

    def packed(self) -> StoredMatrix:
        """The weight as a checkpoint stores it: the loaded codes, or the trainable weight's codes, cached until
        the weight or its width changes (evaluation runs the loaded form's product on them). A rotated layer's
        codes multiply rotated inputs."""
        if self.stored:
            return self.stored_weight
        key = (*((t.data_ptr(), t._version) for t in self._trained()), self.latent.device, self.bits, self.group_size)
        if self._cache is None or self._cache[0] != key:
            if self.learned_scales:
                form = learned_stored(self.latent, self.scale, self.minimum, self.bits, self.group_size)
            else:
                form = stored(self.latent, self.bits, self.group_size)
            self._cache = (key, form)
        return self._cache[1]

    @property
    def keeps_dtypes(self) -> bool:
        """An fp16 bias is stored in fp16 whatever the model's dtype (the loading checks hold the file to it)."""
        return self.half_bias

    def _apply(self, fn, recurse: bool = True) -> LowBitLinear:
        """A stored fp16 bias stays fp16 when the model's dtype changes (``.float()``, a load in bf16)."""
        super()._apply(fn, recurse)
        if self.stored and self.half_bias:
            self._buffers["bias"] = self._buffers["bias"].to(torch.float16)
        return self

    def _trained(self) -> list[nn.Parameter]:
        """The trainable form's parameters the weight is computed from."""
        return [self.latent, *([self.scale, self.minimum] if self.learned_scales else [])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Training: the rounded weight with straight-through gradients. Without gradients (evaluation, a loaded
        checkpoint): the packed codes' own product, so a trained layer scores exactly as it will once loaded."""
        if self.rotation is not None:
            x = self.rotation(x)
        if not self.stored and torch.is_grad_enabled() and any(t.requires_grad for t in (x, *self._trained())):
            output = x @ self.weight.T
        else:
            output = self.packed().matmul_t(x)
        bias = self.dense_bias()
        return output if bias is None else output + bias.to(output.dtype)

    def stored_parameters(self) -> int:
        return self.in_features * self.out_features + (0 if self.bias is None else self.out_features)

    def storage_bits(self) -> int:
        """The packed codes, scales and minima of the weight, plus the bias (and a rotation's sign bits)."""
        codes = (
            self.stored_weight
            if self.stored
            else stored_form((self.out_features, self.in_features), self.bits, self.group_size)
        )
        bias_bits = 16 if self.half_bias else (0 if self.bias is None else self.bias.element_size() * 8)
        bias = 0 if self.bias is None else self.bias.numel() * bias_bits
        signs = 0 if self.rotation is None else self.rotation.signs.numel() * 8
        return codes.storage_bits() + bias + signs

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        rotation = 0 if self.rotation is None else tokens * self.in_features * self.rotation.block
        return tokens * self.in_features * self.out_features + rotation, "lowbit"

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, stored={self.stored}"
            + (", learned_scales=True" if self.learned_scales else "")
            + (", bias_dtype=float16" if self.half_bias else "")
            + ("" if self.rotation is None else f", rotation_block={self.rotation.block}")
        )


def _store_weight(module: LowBitLinear, state_dict: dict, prefix: str, local_metadata) -> None:
    """The trainable form saves what the stored form loads: the codes, not the fp32 weight (and an fp16 bias)."""
    if module.stored:
        return
    if module.half_bias:
        state_dict[prefix + "bias"] = module.bias.detach().half()
    if module.learned_scales:  # the codes and the scales as learned; the parameters themselves are not saved
        for key, value in module.packed().state_dict().items():
            state_dict[f"{prefix}stored_weight.{key}"] = value
        for name in ("latent", "scale", "minimum"):
            state_dict.pop(prefix + name, None)
        return
    save_codes(state_dict, prefix, {"stored_weight": ("latent", module.latent)}, module.bits, module.group_size)
