"""``size_ratio``: every token's row gets its own width under a byte budget, by measured sensitivity (build time
only; not shipped).

Each row is rounded at every candidate width (output-aware where ``rounding="output"``); its sensitivity at a width
is ``weight · (w − ŵ) C (w − ŵ)ᵀ``: how often the token is used (``token_weights``: the calibration text's count,
the model's own text's expected count, plus one) times the expected squared logit error of its row under the
hidden-state covariance ``C``. Widths are then chosen per row by the Lagrangian of "least total sensitivity within
the bytes" (one multiplier found by bisection, the bytes it leaves spent on the best remaining upgrades). Every step
sees a row's values and count, never its id, and each codebook is k-means of the rows in an order set by their
values, so permuting the vocabulary permutes the layer and changes neither its bytes nor its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import torch

from ...progress import progress
from ...runtime.codebook import CodebookTensor
from ...runtime.lowbit import LowBitTensor
from .codebook_rounding import codebook_codes, kmeans
from .layer import tier_storage
from .model_text import ModelText
from .rounding import output_aware_codes

#: Codebooks below this many index bits a weight are fitted and offered only where the budget cannot be met without
#: them: where it can, their cheap rows let the calibration counts move bytes onto the calibration text's tokens and
#: lose on other text (SmolLM2 at 6×, unseen SOTU / mail, weighed by calibration counts alone: 0.156 / 0.247 with
#: them, 0.110 / 0.177 without; with the model's own text too, mixed: 0.118 / 0.071 against 0.098 / 0.104).
NARROW_BITS = 2.5

#: Bisection steps on the multiplier's logarithm (from 1e-12 to 1e12: far finer than one row's bytes).
STEPS = 80


@dataclass
class Width:
    """Every row stored at one width, with what that costs and loses per row."""

    tier: dict
    stored: LowBitTensor | CodebookTensor
    row_bytes: int
    fixed_bytes: int
    errors: torch.Tensor


def fitted_group(columns: int, group: int) -> int:
    """The largest group size ≤ ``group`` that divides ``columns`` (a hidden size the group does not divide)."""
    return max(size for size in range(1, min(group, columns) + 1) if columns % size == 0)


def canonical(vectors: torch.Tensor) -> torch.Tensor:
    """``vectors`` in an order set by their values alone (a seeded projection), so k-means' seeded sampling does
    not depend on the order rows come in."""
    direction = torch.randn(vectors.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return vectors[(vectors.double() @ direction).argsort(stable=True)]


def tier_spec(width: int | str, group: int, dim: int, entries: int) -> dict:
    if width == "codebook":
        return {"bits": "codebook", "group_size": None, "codebook_dim": dim, "codebook_size": entries}
    return {"bits": width, "group_size": None if width == 16 else group}


def _bytes(tier: dict, columns: int) -> tuple[int, int]:
    """(bytes per row, bytes per tier) of a tier stored this way."""
    one, two = (tier_storage({**tier, "rows": rows}, columns).storage_bits() // 8 for rows in (1, 2))
    return two - one, 2 * one - two


def candidates(rows: int, columns: int, dim: int, entries: int, narrow: bool) -> list[tuple[int | str, int, int]]:
    """(width, codebook_dim, codebook_size) of the widths a budget chooses among for a ``(rows, columns)`` matrix.
    With ``narrow`` unset: the integer widths, the configured codebook (whatever its width: the user chose it) and
    the codebooks of ``BUDGET_CODEBOOKS`` of at least ``NARROW_BITS`` index bits a weight; with it set: the further
    codebooks below that. Each codebook comes once, where its vectors divide the row and its table (fp16) is smaller
    than the indices of every row would be (a larger table costs more than it can save)."""
    from .config import BUDGET_CODEBOOKS, BUDGET_WIDTHS

    further = [book for book in BUDGET_CODEBOOKS if book != (dim, entries)]
    wide = [(dim, entries), *(book for book in further if _book_bits(*book) >= NARROW_BITS)]
    books = [book for book in further if _book_bits(*book) < NARROW_BITS] if narrow else wide
    integers = [] if narrow else [(width, 0, 0) for width in BUDGET_WIDTHS if width != "codebook"]
    return integers + [
        ("codebook", d, e)
        for d, e in books
        if columns % d == 0 and e * d * 2 < rows * (columns // d) * (e.bit_length() - 1) // 8
    ]


@torch.no_grad()
def measure_widths(
    weight: torch.Tensor, covariance: torch.Tensor, output_aware: bool, group: int, dim: int, entries: int, narrow: bool
) -> list[Width]:
    """Every row at each width of ``candidates`` (``narrow``: the codebooks below ``NARROW_BITS``), with each row's
    output-aware error."""
    columns = weight.shape[1]
    group = fitted_group(columns, group)
    covariance = covariance.float().to(weight.device)
    scale = weight.pow(2).mean(1, keepdim=True).sqrt().clamp(min=1e-8)
    measured = []
    for width, size, count in progress(
        candidates(*weight.shape, dim, entries, narrow), desc="size_ratio: rows at each width"
    ):
        tier = tier_spec(width, group, size, count)
        if width == "codebook":
            codebook = kmeans(canonical(weight / scale).reshape(-1, size), count)
            stored = codebook_codes(weight, size, count, covariance if output_aware else None, codebook=codebook)
        elif output_aware and width != 16:
            stored = output_aware_codes(weight, covariance, width, group)
        else:
            stored = LowBitTensor.quantize(weight, width, tier["group_size"])
        error = weight - stored.dequantize().to(weight.device)
        measured.append(Width(tier, stored, *_bytes(tier, columns), ((error @ covariance) * error).sum(1).cpu()))
    return measured


def _total(choice: torch.Tensor, widths: list[Width]) -> int:
    row_bytes = torch.tensor([w.row_bytes for w in widths])
    used = torch.bincount(choice, minlength=len(widths)) > 0
    return int(row_bytes[choice].sum()) + sum(w.fixed_bytes for w, on in zip(widths, used) if on)


def allocate(sensitivity: torch.Tensor, widths: list[Width], budget: int) -> torch.Tensor | None:
    """One width index per row: least total ``sensitivity`` (``(rows, widths)``) within ``budget`` bytes (every
    width's per-tier bytes counted when used), or None where even the cheapest rows exceed it."""
    row_bytes = torch.tensor([w.row_bytes for w in widths], dtype=torch.float64)
    loss = sensitivity.double() / sensitivity.double().mean().clamp(min=1e-300)
    cheapest = torch.full((len(loss),), int(row_bytes.argmin()))
    if _total(cheapest, widths) > budget:
        return None
    low, high = -12.0, 12.0  # log10 of the multiplier: low spends more bytes than high
    best = (loss + 10.0**high * row_bytes).argmin(1)
    for _ in range(STEPS):
        middle = (low + high) / 2
        choice = (loss + 10.0**middle * row_bytes).argmin(1)
        if _total(choice, widths) <= budget:
            high, best = middle, choice
        else:
            low = middle
    if _total(best, widths) > budget:
        best = cheapest
    return _spend_rest(best, loss, row_bytes, widths, budget)


def _spend_rest(
    choice: torch.Tensor, loss: torch.Tensor, row_bytes: torch.Tensor, widths: list[Width], budget: int
) -> torch.Tensor:
    """The bytes the multiplier left, spent on each row's best upgrade in order of loss saved per byte (upgrades to
    a width no row uses yet are left out: its tier bytes are not in the slack)."""
    rows = torch.arange(len(choice))
    used = torch.bincount(choice, minlength=len(widths)) > 0
    extra = row_bytes[None] - row_bytes[choice][:, None]
    saved = loss[rows, choice][:, None] - loss
    gain = torch.where((extra > 0) & (saved > 0) & used[None], saved / extra.clamp(min=1), torch.zeros_like(saved))
    best_gain, target = gain.max(1)
    order = best_gain.argsort(descending=True, stable=True)
    order = order[best_gain[order] > 0]
    cost = extra[order, target[order]]
    fits = cost.cumsum(0) <= budget - _total(choice, widths)
    upgraded = choice.clone()
    upgraded[order[fits]] = target[order[fits]]
    return upgraded


def _book_bits(dim: int, entries: int) -> float:
    """Index bits per weight of a codebook of ``entries`` ``dim``-vectors (its shared table not counted)."""
    return (entries.bit_length() - 1) / dim


def token_weights(counts: torch.Tensor, text: ModelText | None) -> torch.Tensor:
    """How often each token is used: its calibration count, plus (with ``text``) its expected count in as many
    tokens of the model's own text as the calibration text holds (half the evidence each: the calibration text
    says what the model will serve, its own text what it was trained on), plus one (no row weighs nothing)."""
    counts = counts.double()
    prior = text.frequencies.to(counts.device) * counts.sum() if text is not None else 0.0
    return counts + prior + 1.0


def choose(weight: torch.Tensor, widths: list[Width], budget: int) -> tuple[torch.Tensor | None, list[Width]]:
    """The allocation with the least total sensitivity (``weight`` per row × its error) over every subset of the
    codebooks (a shared table may not pay for itself on a small vocabulary, and the multiplier does not see it):
    (width index per row, the widths it indexes), or (None, ``widths``) where no subset meets ``budget``."""
    weight = weight.double()
    books = [index for index, width in enumerate(widths) if width.tier["bits"] == "codebook"]
    results = []
    for size in range(len(books) + 1):
        for dropped in combinations(books, size):
            option = [width for index, width in enumerate(widths) if index not in dropped]
            sensitivity = weight[:, None] * torch.stack([w.errors.double() for w in option], 1)
            choice = allocate(sensitivity, option, budget)
            if choice is not None:
                results.append((float(sensitivity.gather(1, choice[:, None]).sum()), choice, option))
    if not results:
        return None, widths
    _, choice, option = min(results, key=lambda result: result[0])
    return choice, option


def subset(width: Width, ids: torch.Tensor) -> LowBitTensor | CodebookTensor:
    """Rows ``ids`` of a width's stored rows (rows are stored independently: exact)."""
    if isinstance(width.stored, LowBitTensor):
        return width.stored.select(ids)
    stored = width.stored
    part = CodebookTensor((len(ids), stored.shape[1]), stored.dim, stored.entries)
    return part.set_indices(stored._indices(ids), stored.scale.index_select(0, ids), stored.codebook)


def width_name(tier: dict) -> str:
    """``int4``, ``bf16`` or ``codebook8x4096`` (vectors of 8, 4,096 entries): one tier's width, as printed."""
    if tier["bits"] == "codebook":
        return f"codebook{tier['codebook_dim']}x{tier['codebook_size']}"
    return "bf16" if tier["bits"] == 16 else f"int{tier['bits']}"


def describe(tiers: list[dict], stored_bytes: int, dense_bytes: int) -> str:
    """One line: rows per width and the size reached, as printed after a ``size_ratio`` build."""
    parts = ", ".join(f"{tier['rows']}×{width_name(tier)}" for tier in tiers)
    ratio = dense_bytes / stored_bytes
    return f"size_ratio allocation: {parts}; {stored_bytes:,} bytes stored, {ratio:.3f}× smaller than bf16"
