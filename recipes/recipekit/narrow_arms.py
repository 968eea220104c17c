"""The ``narrow-<d_model>[-<lowbit arm>]`` arm: the smaller model a user could train instead of compressing the one
they have. A fresh model of the same family, context and patches at a narrower ``d_model`` (its FFN and attention
heads scaled with it, every head as wide as before), trained dense or as a ``lowbit-`` arm with the same steps, data
and model selection as every arm; its bytes are counted against the full-width model's fp32 Linears, so that its
fraction sits on the same axis as every compressed arm's."""

from __future__ import annotations

from dataclasses import replace

import torch

from .arm_names import NARROW_ARM
from .costs import byte_counts
from .forecasters import Size


def narrow_arm(name: str) -> tuple[int, str | None] | None:
    """(d_model, the ``lowbit-`` arm it trains as, or None for dense) of a ``narrow-`` arm name, or None."""
    match = NARROW_ARM.fullmatch(name)
    return None if match is None else (int(match.group(1)), match.group(2))


def narrower(size: Size, width: int) -> Size:
    """``size`` at ``d_model=width``: the FFN and the heads in proportion (the head dimension kept), the rest as is."""
    head = size.d_model // size.heads
    if not (width < size.d_model and width % head == 0):
        raise ValueError(
            f"narrow-{width}: d_model {width} must be below the full width {size.d_model} and a multiple of its head "
            f"width {head} (e.g. {', '.join(str(w) for w in range(head, size.d_model, head)[:4])})"
        )
    return replace(size, d_model=width, heads=width // head, ffn=size.ffn * width // size.d_model)


def against_full_width(counts: dict, full_width: torch.nn.Module) -> dict:
    """``byte_counts`` of a narrow model with its fractions taken of the full-width model's fp32 bytes (``dense``
    stays the narrow model's own fp32 bytes; ``full_width_dense`` is the denominator)."""
    full = byte_counts(full_width)
    return {
        key: {
            **counts[key],
            "full_width_dense": full[key]["dense"],
            "disk_ratio": counts[key]["disk"] / full[key]["dense"],
            "ram_ratio": counts[key]["ram"] / full[key]["dense"],
        }
        for key in counts
    }
