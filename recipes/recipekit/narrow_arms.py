"""The ``narrow-<d_model>[x<layers>][-<lowbit arm>]`` arm: the smaller model a user could train instead of
compressing the one they have. A fresh model of the same family, context and patches at a narrower ``d_model`` (its
FFN and attention heads scaled with it, every head as wide as before) and, with ``x<layers>``, another number of
encoder layers (width traded for depth at equal bytes), trained dense or as a ``lowbit-`` arm with the same steps,
data and model selection as every arm; its bytes are counted against the full-width model's fp32 Linears, so that
its fraction sits on the same axis as every compressed arm's."""

from __future__ import annotations

from dataclasses import replace

import torch

from .arm_names import NARROW_ARM
from .costs import byte_counts
from .forecasters import Size

#: A narrow model's shape: its d_model and its number of encoder layers (None: the full model's).
Shape = tuple[int, int | None]


def narrow_arm(name: str) -> tuple[Shape, str | None] | None:
    """(shape, the ``lowbit-`` arm it trains as, or None for dense) of a ``narrow-`` arm name, or None."""
    match = NARROW_ARM.fullmatch(name)
    if match is None:
        return None
    return (int(match.group(1)), None if match.group(2) is None else int(match.group(2))), match.group(3)


def narrower(size: Size, shape: Shape) -> Size:
    """``size`` at ``d_model`` and encoder layers ``shape``: the FFN and the heads in proportion (the head dimension
    kept), the rest as is. A model no smaller than ``size`` is refused: it is not an arm under a byte budget."""
    width, asked = shape
    layers = size.encoder_layers if asked is None else asked
    head = size.d_model // size.heads
    name = f"narrow-{width}" + ("" if asked is None else f"x{asked}")
    if width % head or width > size.d_model:
        raise ValueError(
            f"{name}: d_model {width} must be a multiple of the head width {head} up to the full width {size.d_model} "
            f"(e.g. {', '.join(str(w) for w in range(head, size.d_model, head)[:4])})"
        )
    if width == size.d_model and layers >= size.encoder_layers:
        raise ValueError(
            f"{name}: the full width with {layers} encoder layers is no smaller than the model; narrow it below "
            f"d_model {size.d_model} or give it fewer than its {size.encoder_layers} layers (narrow-{width}x1)"
        )
    return replace(
        size, d_model=width, heads=width // head, ffn=size.ffn * width // size.d_model, encoder_layers=layers
    )


def against_full_model(counts: dict, full_model: torch.nn.Module) -> dict:
    """``byte_counts`` of a narrow model with its fractions taken of the full model's fp32 bytes (``dense``
    stays the narrow model's own fp32 bytes; ``full_width_dense`` is the denominator)."""
    full = byte_counts(full_model)
    return {
        key: {
            **counts[key],
            "full_width_dense": full[key]["dense"],
            "disk_ratio": counts[key]["disk"] / full[key]["dense"],
            "ram_ratio": counts[key]["ram"] / full[key]["dense"],
        }
        for key in counts
    }
