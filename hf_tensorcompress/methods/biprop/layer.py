"""Biprop sparse-binary linear layer (Sparse Binary Transformers).

Frozen random weights ``W``, learned scores ``S``; the forward keeps the top ``keep_ratio`` fraction of ``|S|``
(mask ``M``) and uses the weight ``α · sign(W) ⊙ M`` with ``α = ‖M ⊙ W‖₁ / ‖M‖₁``.

On disk a trained layer is ``mask_bits`` (``M`` packed 8 per byte) and ``alpha`` (one fp32): the signs of ``W`` are
not stored because ``W`` is never trained and its signs are a pure function of ``sign_seed`` (a counter-based hash
computed with 32-bit integer arithmetic in torch, identical on every device and torch version). That is 1 bit per
weight — packed sign bits beside the mask would be 2 bits (1/16 of fp32) and could not reach 1/25. A layer built
with ``save_scores=True`` also stores ``scores`` and ``frozen_weight`` so that training can resume. The frozen weight
is not called ``weight``: a checkpoint's ``<module>.weight`` key is the tombstone that makes a plain transformers
class refuse the file (``runtime/modeling_tensorcompress.py``), and a frozen ``W`` under that key would load silently.

In RAM the inference-only form (a checkpoint without scores, as ``from_pretrained`` loads it) holds 2 bits per
weight: ``mask_bits`` and the signs packed the same way (regenerated from ``sign_seed`` once per device, never
saved). Its forward unpacks the ternary weight ``sign ⊙ M`` a block of output rows at a time through a 256-entry
table and multiplies that block, so no full-size float (or int8) copy of the weight ever stays in memory.

Ships inside saved checkpoints: torch only.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.bit_packing import pack_bits, unpack_bits
from ...runtime.contract import CompressedLinear, TensorProblem

WEIGHT_INITS = ("kaiming_normal", "signed_constant")
_MASK32 = 0xFFFFFFFF
#: Weights unpacked at once by the inference-only forward (a block of output rows): bounds its transient memory.
BLOCK_WEIGHTS = 1 << 18


def _mul32(x, constant: int):
    """``x · constant mod 2³²`` for ``x < 2³²`` without int64 overflow (16-bit halves of the constant)."""
    low, high = constant & 0xFFFF, constant >> 16
    return ((x * low) + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _hash32(x):
    """Wellons' ``lowbias32`` integer hash of a Python int or an int64 tensor holding values < 2³²."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_signs(seed: int, numel: int, device: torch.device | None = None, start: int = 0) -> torch.Tensor:
    """``numel`` signs in {-1, +1} (int8) fixed by ``seed``: bit 31 of ``hash(index + hash(seed))``, for the
    indices ``start … start + numel - 1`` (so a long run of signs can be made a chunk at a time)."""
    offset = _hash32(seed & _MASK32)
    index = (torch.arange(start, start + numel, dtype=torch.int64, device=device) + offset) & _MASK32
    bits = (_hash32(index) >> 31) & 1
    return (bits * 2 - 1).to(torch.int8)


def sign_check(seed: int, numel: int) -> str:
    """A short fingerprint of the signs ``seed`` regenerates (the first 64, packed, as hex), recorded in the spec: a
    checkpoint whose ``sign_seed`` was edited, or code whose hash differs, is refused instead of giving other outputs."""
    signs = seeded_signs(seed, min(numel, 64), device=torch.device("cpu"))
    return "".join(f"{byte:02x}" for byte in pack_bits(signs > 0).tolist())


@functools.cache
def bit_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(256, 8)`` table: row ``b`` holds the bits of byte ``b``, most significant first, as ``dtype`` (8 KB in
    fp32, one per dtype and device for every layer)."""
    shifts = torch.arange(7, -1, -1, device=device)
    return ((torch.arange(256, device=device).view(-1, 1) >> shifts) & 1).to(dtype)


def kept_count(numel: int, keep_ratio: float) -> int:
    """Weights kept: what Biprop's code keeps (it prunes ``int((1 - p) · numel)``, so ``p`` is the kept fraction)."""
    return max(1, numel - int((1.0 - keep_ratio) * numel))


def top_mask(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Float mask of the ``keep`` largest ``|scores|``."""
    mask = torch.zeros(scores.numel(), dtype=scores.dtype, device=scores.device)
    mask[scores.detach().abs().reshape(-1).topk(keep, sorted=False).indices] = 1.0
    return mask.view_as(scores)


class _ScaledMask(torch.autograd.Function):
    """``α · M`` from ``|S|`` and ``W``; backward sends ``g · |W|`` to ``|S|`` and nothing to ``W``.

    The straight-through rule of Biprop's reference code (``GetQuantnet_binary``): ``g`` is the gradient reaching
    ``α·M``, i.e. ``∂L/∂W_eff ⊙ sign(W)``; the caller passes ``|S|`` so autograd adds the factor ``sign(S)``.
    """

    @staticmethod
    def forward(ctx, abs_scores: torch.Tensor, weight: torch.Tensor, keep: int) -> torch.Tensor:
        mask = top_mask(abs_scores, keep)
        alpha = (weight.abs() * mask).sum() / mask.sum()
        ctx.save_for_backward(weight)
        return alpha * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        return grad * weight.abs(), None, None


class BipropLinear(CompressedLinear):
    """``y = x (α · sign(W) ⊙ M)ᵀ (+ b)``: frozen random ``W``, learned scores choose ``M``; no bias (as in SBT)
    unless ``bias=True`` (an fp32 bias, e.g. the replaced Linear's, kept where a layer must compute what it did).

    Args:
        keep_ratio: fraction of weights kept (the paper's "prune rate p" — its code keeps that fraction).
        weight_init: ``"kaiming_normal"`` or ``"signed_constant"`` (``±`` the Kaiming std); only ``|W|`` differs,
            the signs always come from ``sign_seed``.
        sign_seed: fixes the signs of ``W`` (and so of the binary weights); stored in the spec.
        save_scores: also store ``scores`` and ``frozen_weight`` in checkpoints (to resume training); otherwise a saved
            layer is only ``mask_bits`` + ``alpha`` and loads as an inference-only layer.
        trainable: ``False`` builds the inference-only form (no scores, no ``W``), as loaded from a bits checkpoint.
        bias: an fp32 bias added to the output (trained, saved).
    """

    layer_type = "biprop"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        keep_ratio: float = 0.5,
        weight_init: str = "kaiming_normal",
        sign_seed: int = 0,
        save_scores: bool = False,
        trainable: bool = True,
        generator: torch.Generator | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 < keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio is the fraction of weights kept and must be in (0, 1], got {keep_ratio}")
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"weight_init={weight_init!r} is not supported; choose one of {list(WEIGHT_INITS)}")
        self.in_features, self.out_features = in_features, out_features
        self.keep_ratio, self.weight_init = float(keep_ratio), weight_init
        self.sign_seed, self.save_scores, self.trainable = int(sign_seed), bool(save_scores), bool(trainable)
        numel = in_features * out_features
        self._signs: dict[torch.device, torch.Tensor] = {}
        self._sign_bits: dict[torch.device, torch.Tensor] = {}
        self.register_buffer("mask_bits", torch.zeros((numel + 7) // 8, dtype=torch.uint8))
        self.register_buffer("alpha", torch.zeros(1))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        if trainable:
            self.scores = nn.Parameter(torch.empty(out_features, in_features))
            self.register_buffer("frozen_weight", torch.empty(out_features, in_features))
            self.register_state_dict_post_hook(_pack_on_save)
        self.reset_parameters(generator)
        self._cache: tuple[tuple, torch.Tensor] | None = None

    @property
    def keep(self) -> int:
        return kept_count(self.in_features * self.out_features, self.keep_ratio)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Biprop's init: Kaiming-normal (fan-in, ReLU gain) magnitudes with the seeded signs, Kaiming-uniform scores;
        the inference-only form keeps what they give (the top-``keep`` mask bits and α). Draws run on the CPU and are
        copied in, so the result does not depend on the device; on the meta device there is nothing to fill."""
        if self.alpha.is_meta:
            return
        if generator is None:  # the same draw as when the layer was built from its seed (methods/biprop/apply.py)
            generator = torch.Generator().manual_seed(self.sign_seed)
        shape = (self.out_features, self.in_features)
        std = math.sqrt(2.0 / self.in_features)
        signs = seeded_signs(self.sign_seed, shape[0] * shape[1], device=torch.device("cpu")).view(shape).float()
        if self.weight_init == "kaiming_normal":
            magnitude = torch.randn(shape, generator=generator, device="cpu").abs() * std
        else:
            magnitude = torch.full(shape, std, device="cpu")
        bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=√5), as Biprop initialises scores
        scores = torch.rand(shape, generator=generator, device="cpu") * 2 * bound - bound
        with torch.no_grad():
            if self.trainable:
                self.frozen_weight.copy_(signs * magnitude)
                self.scores.copy_(scores)
                self._refresh_packed()
            else:
                mask = top_mask(scores, self.keep)
                self.mask_bits.copy_(pack_bits(mask.bool()))
                self.alpha.copy_((magnitude * mask).sum() / mask.sum())
            if self.bias is not None:
                self.bias.zero_()

    @torch.no_grad()
    def start_from(self, weight: torch.Tensor) -> None:
        """Start a trainable layer from a dense ``(out, in)`` weight: the frozen magnitudes are ``|weight|`` (the signs
        stay the seed's) and the scores favour the large weights whose sign the seed agrees with, so the first mask
        keeps those and ``α · sign ⊙ M`` approximates ``weight`` where it can (a layer switched to biprop mid-training
        keeps much of what it computed, instead of starting from a random mask)."""
        if not self.trainable:
            raise ValueError("start_from needs the trainable form (scores and frozen weights)")
        signs = self.signs().to(weight.dtype)
        magnitude = weight.detach().abs().to(self.frozen_weight.device)
        self.frozen_weight.copy_(signs * magnitude)
        agree = (torch.sign(weight.detach()) == signs).to(magnitude.dtype)
        self.scores.copy_(magnitude * agree + 1e-6 * magnitude.mean() * (1 - agree))
        self._refresh_packed()
        self._cache = None

    @property
    def weight(self) -> torch.Tensor:
        """The frozen random ``W`` (trainable form only)."""
        return self.frozen_weight

    # ------------------------------------------------------------------ weights
    def mask(self) -> torch.Tensor:
        """The current binary mask ``M`` (float, shape ``out × in``)."""
        if self.trainable:
            return top_mask(self.scores, self.keep)
        return (
            unpack_bits(self.mask_bits, self.in_features * self.out_features)
            .view(self.out_features, self.in_features)
            .to(self.alpha.dtype)
        )

    def signs(self) -> torch.Tensor:
        """``sign(W)`` as int8, regenerated from ``sign_seed`` once per device (not state: never saved)."""
        device = self.alpha.device
        if device not in self._signs:
            self._signs[device] = seeded_signs(self.sign_seed, self.in_features * self.out_features, device).view(
                self.out_features, self.in_features
            )
        return self._signs[device]

    def sign_bits(self) -> torch.Tensor:
        """``sign(W) > 0`` packed 8 per byte like ``mask_bits``, regenerated from ``sign_seed`` once per device."""
        device = self.mask_bits.device
        if device not in self._sign_bits:  # in chunks: the hash's int64 temporaries stay small
            numel = self.in_features * self.out_features
            self._sign_bits[device] = torch.cat(
                [
                    pack_bits(seeded_signs(self.sign_seed, min(BLOCK_WEIGHTS, numel - start), device, start) > 0)
                    for start in range(0, numel, BLOCK_WEIGHTS)
                ]
            )
        return self._sign_bits[device]

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (α · sign(W) ⊙ M)ᵀ`` from the packed bits, ``rows`` output rows at a time (a multiple of 8, so each
        block starts on a byte): the +1 and -1 bits of a block are looked up as floats, subtracted, scaled by α
        (the folded weight's exact values), multiplied."""
        table, signs, mask, alpha = (
            bit_table(x.dtype, x.device),
            self.sign_bits(),
            self.mask_bits,
            self.alpha.to(x.dtype),
        )
        rows = max(8, BLOCK_WEIGHTS // self.in_features // 8 * 8)
        outputs = []
        for start in range(0, self.out_features, rows):
            stop = min(start + rows, self.out_features)
            first, last = start * self.in_features // 8, (stop * self.in_features + 7) // 8
            block_mask, block_signs = mask[first:last], signs[first:last]
            plus = table[(block_mask & block_signs).long()].view(-1)
            minus = table[(block_mask & ~block_signs).long()].view(-1)
            weight = (plus - minus)[: (stop - start) * self.in_features].view(stop - start, self.in_features) * alpha
            outputs.append(F.linear(x, weight))
        output = torch.cat(outputs, dim=-1)
        return output if self.bias is None else output + self.bias

    def effective_weight(self) -> torch.Tensor:
        """``α · sign(W) ⊙ M`` with gradients to the scores (training path)."""
        if not self.trainable:
            return self.alpha * self.signs().to(self.alpha.dtype) * self.mask()
        scaled = _ScaledMask.apply(self.scores.abs(), self.frozen_weight, self.keep)
        return self.signs().to(scaled.dtype) * scaled

    def folded_weight(self) -> torch.Tensor:
        """The effective weight with mask and signs folded in, cached until the scores or bits change."""
        source = self.scores if self.trainable else self.mask_bits
        key = (source.data_ptr(), source._version, self.alpha._version, source.device, self.alpha.dtype)
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                if self.trainable:
                    self._refresh_packed()
                    key = (source.data_ptr(), source._version, self.alpha._version, source.device, self.alpha.dtype)
                weight = self.alpha * self.signs().to(self.alpha.dtype) * self.mask()
            self._cache = (key, weight)
        return self._cache[1]

    def dense_weight(self) -> torch.Tensor:
        """``decompress``: the weight the forward uses (``α · sign(W) ⊙ M``), not the frozen random ``W``."""
        return self.folded_weight()

    @torch.no_grad()
    def _refresh_packed(self) -> None:
        """Write the current mask and α into the persistent ``mask_bits`` / ``alpha`` buffers."""
        mask = top_mask(self.scores, self.keep)
        self.mask_bits.copy_(pack_bits(mask.bool()))
        self.alpha.copy_((self.frozen_weight.abs() * mask).sum() / mask.sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.trainable:
            return self.packed_forward(x)
        if self.training and torch.is_grad_enabled():
            weight = self.effective_weight()
        else:
            weight = self.folded_weight()
        return F.linear(x, weight.to(x.dtype), self.bias)

    def check_state(self) -> None:
        """The mask keeps exactly ``keep`` weights with nothing in the padding bits, and ``α`` is positive: the
        packed forward reads the bits as they are, so an edited mask or scale would change the outputs."""
        if self.mask_bits.is_meta:
            return
        numel = self.in_features * self.out_features
        if numel % 8 and int(self.mask_bits[-1]) & ((1 << (8 - numel % 8)) - 1):
            raise TensorProblem("mask_bits", f"has bits set past the {numel} weights (padding is 0)")
        kept = int(unpack_bits(self.mask_bits, numel).sum())
        if kept != self.keep:
            raise TensorProblem(
                "mask_bits", f"keeps {kept} weights, but keep_ratio={self.keep_ratio} keeps {self.keep}"
            )
        if not bool((self.alpha > 0).all()):
            raise TensorProblem("alpha", f"is {self.alpha.tolist()}, where the scale of the kept weights is positive")

    # ------------------------------------------------------------------ structure
    def spec(self) -> dict:
        return {
            "type": self.layer_type,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "keep_ratio": self.keep_ratio,
            "weight_init": self.weight_init,
            "sign_seed": self.sign_seed,
            "sign_check": sign_check(self.sign_seed, self.in_features * self.out_features),
            "save_scores": self.save_scores,
        } | ({"bias": True} if self.bias is not None else {})

    @classmethod
    def from_spec(cls, spec: dict) -> BipropLinear:
        """The layer as a checkpoint holds it: trainable only if the checkpoint kept its scores. The regenerated signs
        must match the recorded ``sign_check`` (specs written before it existed have none)."""
        recorded = spec.get("sign_check")
        if recorded is not None:
            expected = sign_check(spec["sign_seed"], spec["in_features"] * spec["out_features"])
            if recorded != expected:
                raise ValueError(
                    f"sign_seed={spec['sign_seed']} regenerates signs with fingerprint {expected}, but the layer was "
                    f"trained with fingerprint {recorded}: sign_seed was edited (restore it) or this code regenerates "
                    "signs differently from the code that saved the checkpoint"
                )
        return cls(
            spec["in_features"],
            spec["out_features"],
            spec["keep_ratio"],
            spec["weight_init"],
            spec["sign_seed"],
            save_scores=spec["save_scores"],
            trainable=spec["save_scores"],
            bias=spec.get("bias", False),
        )

    # ------------------------------------------------------------------ costs
    def dense_parameters(self) -> int:
        """Parameters of the ``nn.Linear`` (with bias) this layer replaces."""
        return self.in_features * self.out_features + self.out_features

    def stored_parameters(self) -> int:
        """Non-zero binary weights plus α (and the bias): what inference needs (the paper's "Params (Binary)")."""
        return self.keep + 1 + (0 if self.bias is None else self.out_features)

    def storage_bits(self) -> int:
        """Bits of the saved inference form: one mask bit per weight (padded to bytes) + fp32 α (+ the bias)."""
        return self.mask_bits.numel() * 8 + 32 + (0 if self.bias is None else 32 * self.out_features)

    def multiply_adds(self, tokens: int, cached: bool = False) -> tuple[int, str]:
        """Non-zero multiply-adds: only kept weights multiply (paper §5.1: ``d·m·p``)."""
        return tokens * self.keep, "sparse-binary"

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, keep_ratio={self.keep_ratio}, "
            f"trainable={self.trainable}"
        )


def _pack_on_save(module: BipropLinear, state_dict: dict, prefix: str, local_metadata) -> None:
    """Refresh ``mask_bits``/``alpha`` from the scores; drop scores and ``W`` unless ``save_scores``."""
    module._refresh_packed()
    state_dict[prefix + "mask_bits"] = module.mask_bits
    state_dict[prefix + "alpha"] = module.alpha
    if not module.save_scores:
        state_dict.pop(prefix + "scores", None)
        state_dict.pop(prefix + "frozen_weight", None)
