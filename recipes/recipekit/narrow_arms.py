"""The ``narrow-<d_model>[x<layers>][-ffn<width>][-shared][-<lowbit arm>]`` arm: the smaller model a user could
train instead of compressing the one they have. A fresh model of the same family, context and patches at a narrower
``d_model`` (its FFN and attention heads scaled with it, every head as wide as before) and, with ``x<layers>``,
another number of encoder layers (width traded for depth at equal bytes) and, with ``-ffn<width>``, another FFN width
(the FFN's bytes traded for attention's or for depth), trained dense or as a ``lowbit-`` arm with the same steps, data
and model selection as every arm; its bytes are counted against the full model's fp32 Linears, so that its fraction
sits on the same axis as every compressed arm's. With ``-shared`` (dense or an ``ends-`` arm) every encoder layer
after the first computes with the first's Linears (``{"method": "shared"}`` forms), keeping its own norms: the depth
of several layers at the bytes of one. ``--search-shape`` gives the byte search and its allocations such a model
(``SearchShape``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hf_tensorcompress.core.metrics import linear_bytes

from .arm_names import NARROW_ARM
from .byte_arms import shared_linears
from .costs import byte_counts
from .forecasters import Size

#: A narrow model's shape: its d_model, its number of encoder layers (None: the full model's), its FFN width (None:
#: the full model's in proportion to d_model) and whether the layers after the first share the first's Linears.
Shape = tuple[int, int | None, int | None, bool]


def narrow_arm(name: str) -> tuple[Shape, str | None] | None:
    """(shape, the ``lowbit-`` arm it trains as, or None for dense) of a ``narrow-`` arm name, or None."""
    match = NARROW_ARM.fullmatch(name)
    if match is None:
        return None
    layers, ffn = (None if match.group(group) is None else int(match.group(group)) for group in (2, 3))
    return (int(match.group(1)), layers, ffn, match.group(4) is not None), match.group(5)


def narrower(size: Size, shape: Shape) -> Size:
    """``size`` at the d_model, encoder layers and FFN width of ``shape``: the heads (and an FFN not given) in
    proportion (the head dimension kept), the rest as is. A model no smaller than ``size`` in any of them (without
    shared layers) is refused: it is not an arm under a byte budget; so is sharing in a model of one layer."""
    width, asked, asked_ffn, shared = shape
    layers = size.encoder_layers if asked is None else asked
    ffn = size.ffn * width // size.d_model if asked_ffn is None else asked_ffn
    head = size.d_model // size.heads
    name = f"narrow-{width}" + ("" if asked is None else f"x{asked}") + ("" if asked_ffn is None else f"-ffn{ffn}")
    name += "-shared" if shared else ""
    if width % head or width > size.d_model:
        raise ValueError(
            f"{name}: d_model {width} must be a multiple of the head width {head} up to the full width {size.d_model} "
            f"(e.g. {', '.join(str(w) for w in range(head, size.d_model, head)[:4])})"
        )
    if shared and layers < 2:
        raise ValueError(f"{name}: one encoder layer has no later layer to share its Linears; give it x2 or more")
    if width == size.d_model and layers >= size.encoder_layers and ffn >= size.ffn and not shared:
        raise ValueError(
            f"{name}: the full width with {layers} encoder layers and an FFN of {ffn} is no smaller than the model; "
            f"narrow it below d_model {size.d_model}, give it fewer than its {size.encoder_layers} layers "
            f"(narrow-{width}x1) or an FFN narrower than its {size.ffn} (narrow-{width}-ffn{size.ffn // 2})"
        )
    return replace(size, d_model=width, heads=width // head, ffn=ffn, encoder_layers=layers)


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


@dataclass(frozen=True)
class SearchShape:
    """The byte search's model where ``--search-shape`` names a narrow shape: its name (the dense arm of that shape,
    on which greedy measures), its shape, the shares of its layers ({Linear: source}), and the search's budget as a
    fraction of what its searched Linears store dense, which is ``--budget-ratio`` of the full model's fp32 Linears;
    ``model``: one built at that shape (for the budget's check)."""

    name: str
    shape: Shape
    shared: dict[str, str]
    byte_budget: float
    model: torch.nn.Module


def search_shape(
    name: str,
    size: Size,
    budget_ratio: float | None,
    full_model: torch.nn.Module,
    build: Callable[[Size], torch.nn.Module],
) -> SearchShape:
    """The ``SearchShape`` of ``--search-shape name`` (``build(size)``: a fresh model of that size); a
    ``ValueError`` says what the flag takes."""
    found = narrow_arm(name)
    if found is None or found[1] is not None:
        raise ValueError(
            f"--search-shape {name}: a shape without an arm, narrow-<d_model>[x<layers>][-ffn<width>][-shared] "
            "(e.g. narrow-128x4-shared: one layer's Linears used by four)"
        )
    if budget_ratio is None:
        raise ValueError(f"--search-shape {name} is the byte search's model; pass --budget-ratio too")
    model = build(narrower(size, found[0]))
    shared = shared_linears(model) if found[0][3] else {}
    rows = linear_bytes(model)["modules"]
    dense = sum(row["dense"] for name, row in rows.items() if name not in shared)
    fraction = budget_ratio * linear_bytes(full_model)["dense"] / dense
    if fraction > 1:
        raise ValueError(
            f"--search-shape {name} with --budget-ratio {budget_ratio:.4g}: the budget is more than the shape stores "
            "dense; choose a wider shape or a smaller budget"
        )
    return SearchShape(name, found[0], shared, fraction, model)
