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
from torch import nn

from ...core.progress import progress
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

#: The widths a protected token's row may take (``protected_tokens``, the model's special tokens): int8 and bf16
#: rows, which lose nothing measurable however rarely the calibration text uses the token.
WIDE_ENOUGH = (8, 16)

#: Bisection steps on the multiplier's logarithm (from 1e-12 to 1e12: far finer than one row's bytes).
STEPS = 80


#: Vectors a codebook's k-means is fitted on (a seeded sample of every row's vectors).
KMEANS_SAMPLE = 400_000

#: Rows measured at once: 4M values (16 MB in float32), and each width's rounding holds a few copies of them as work
#: and errors, so memory does not grow with the vocabulary (twice this held 0.6 GB at the peak for 262,144 rows).
CHUNK_VALUES = 1 << 22


@dataclass
class Width:
    """One width every row could be stored at: its spec, what it costs per row and per tier, each row's error at it,
    and (codebooks) the table fitted once for all its rows and every row stored with it (``rows``)."""

    tier: dict
    row_bytes: int
    fixed_bytes: int
    errors: torch.Tensor
    codebook: torch.Tensor | None = None
    rows: CodebookTensor | None = None

    def stored(self, weight: torch.Tensor, ids: torch.Tensor, covariance: torch.Tensor | None) -> nn.Module:
        """Rows ``ids`` of ``weight`` stored at this width: a codebook's rows as measured (choosing their indices is
        the build's costliest rounding, and rows are stored independently, so they are what ``store`` would give
        again); other widths' rows are rounded now (kept, int8 rows alone would take a byte a weight)."""
        if self.rows is None:
            return store(weight[ids].float(), self.tier, covariance, self.codebook)
        part = CodebookTensor((len(ids), self.rows.shape[1]), self.rows.dim, self.rows.entries)
        ids = ids.to(self.rows.codes.device)
        for name, buffer in self.rows.named_buffers():
            part.get_buffer(name).copy_(buffer if name == "codebook" else buffer[ids])
        return part


def store(
    rows: torch.Tensor, tier: dict, covariance: torch.Tensor | None, codebook: torch.Tensor | None = None
) -> LowBitTensor | CodebookTensor:
    """``rows`` stored as ``tier`` says: output-aware under ``covariance`` where given, else round-to-nearest; a
    codebook tier uses ``codebook`` where given (else k-means of ``rows``). Rows are stored independently, so any
    subset of rows stored on its own is stored as it would be among the others."""
    if tier["bits"] == "codebook":
        return codebook_codes(rows, tier["codebook_dim"], tier["codebook_size"], covariance, codebook=codebook)
    if covariance is not None and tier["bits"] != 16:
        return output_aware_codes(rows, covariance, tier["bits"], tier["group_size"])
    return LowBitTensor.quantize(rows, tier["bits"], tier["group_size"])


def fill_rows(stored: nn.Module, first: int, part: nn.Module) -> None:
    """Rows ``first`` … of ``stored`` from ``part``, stored alike (rows are stored independently; a codebook's
    shared table is the same for both and is copied whole)."""
    for name, buffer in part.named_buffers():
        target = stored.get_buffer(name)
        if name == "codebook":
            target.copy_(buffer)
        else:
            target[first : first + len(buffer)] = buffer


def fitted_group(columns: int, group: int) -> int:
    """The largest group size ≤ ``group`` that divides ``columns`` (a hidden size the group does not divide)."""
    return max(size for size in range(1, min(group, columns) + 1) if columns % size == 0)


def codebook_vectors(weight: torch.Tensor, scale: torch.Tensor, dim: int, most: int = KMEANS_SAMPLE) -> torch.Tensor:
    """The ``dim``-vectors of ``weight / scale`` a codebook is fitted on: at most ``most`` of them, drawn by a seeded
    permutation of the vectors in an order set by their rows' values alone (a seeded projection), so the sample does
    not depend on the order rows come in. Read a chunk of rows at a time: no scaled copy of the whole matrix."""
    rows, columns = weight.shape
    direction = torch.randn(columns, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    chunk = max(1, CHUNK_VALUES // columns)
    keys = torch.empty(rows, dtype=torch.float64)  # allocated first: see measure_widths
    for start in range(0, rows, chunk):
        keys[start : start + chunk] = (
            weight[start : start + chunk].double() / scale[start : start + chunk]
        ).cpu() @ direction
    order, per_row = keys.argsort(stable=True), columns // dim
    total = rows * per_row
    generator = torch.Generator().manual_seed(0)
    if total <= 4 * most:
        pick = torch.randperm(total, generator=generator)[:most].sort().values
    else:  # a permutation of every vector's index takes 8 bytes a vector (335 MB at 262,144 × 640): draw the sample
        pick = torch.randint(total, (most,), generator=generator).unique()  # sorted, a few repeats dropped
    at_rows, at = order[pick // per_row].to(weight.device), (pick % per_row).to(weight.device)
    return weight.reshape(rows, per_row, dim)[at_rows, at].float() / scale[at_rows]


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
    """Every row's output-aware error at each width of ``candidates`` (``narrow``: the codebooks below
    ``NARROW_BITS``), rounded a chunk of rows at a time. A codebook width keeps every row as stored (its indices and
    scale: the bytes that width stores them in, 0.32 bytes a weight at 4 × 1,024); other widths keep nothing
    (``Width.stored`` rounds the chosen rows again)."""
    rows, columns = weight.shape
    group = fitted_group(columns, group)
    covariance = covariance.float().to(weight.device)
    scale = torch.cat([part.float().pow(2).mean(1, keepdim=True) for part in weight.split(CHUNK_VALUES // columns)])
    scale = scale.sqrt().clamp(min=1e-8)
    chunk = max(1, CHUNK_VALUES // columns)
    measured = []
    for width, size, count in progress(
        candidates(rows, columns, dim, entries, narrow), desc="size_ratio: rows at each width"
    ):
        tier = tier_spec(width, group, size, count)
        book = kmeans(codebook_vectors(weight, scale, size), count) if width == "codebook" else None
        # one tensor for every row's error, allocated before the chunks: a small result kept per chunk would sit
        # between the chunks' large temporaries on the heap and keep their freed space from being reused
        errors = torch.empty(rows)
        kept = CodebookTensor((rows, columns), size, count) if width == "codebook" else None
        for start in range(0, rows, chunk):
            part = weight[start : start + chunk].float()
            stored = store(part, tier, covariance if output_aware else None, book)
            if kept is not None:
                fill_rows(kept, start, stored)
            error = stored.dequantize().to(part.device)
            error.sub_(part)  # (ŵ − w): the quadratic form below does not see the sign; in place, one copy fewer
            errors[start : start + chunk] = (error @ covariance).mul_(error).sum(1).cpu()
        measured.append(Width(tier, *_bytes(tier, columns), errors, book, kept))
    return measured


def _total(choice: torch.Tensor, widths: list[Width]) -> int:
    row_bytes = torch.tensor([w.row_bytes for w in widths])
    used = torch.bincount(choice, minlength=len(widths)) > 0
    return int(row_bytes[choice].sum()) + sum(w.fixed_bytes for w, on in zip(widths, used) if on)


def allocate(
    sensitivity: torch.Tensor, widths: list[Width], budget: int, barred: torch.Tensor | None = None
) -> torch.Tensor | None:
    """One width index per row: least total ``sensitivity`` (``(rows, widths)``) within ``budget`` bytes (every
    width's per-tier bytes counted when used), never a width ``barred`` (``(rows, widths)``) for its row, or None
    where even the cheapest rows allowed exceed it."""
    row_bytes = torch.tensor([w.row_bytes for w in widths], dtype=torch.float64)
    loss = sensitivity.double() / sensitivity.double().mean().clamp(min=1e-300)
    costs = row_bytes[None].expand_as(loss)
    if barred is not None:
        loss, costs = loss.masked_fill(barred, torch.inf), costs.masked_fill(barred, torch.inf)
    cheapest = costs.argmin(1)
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


def choose(
    weight: torch.Tensor, widths: list[Width], budget: int, protected: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, list[Width]]:
    """The allocation with the least total sensitivity (``weight`` per row × its error) over every subset of the
    codebooks (a shared table may not pay for itself on a small vocabulary, and the multiplier does not see it),
    rows ``protected`` (a bool per row) at ``FLOOR_BITS`` or wider: (width index per row, the widths it indexes), or
    (None, ``widths``) where no subset meets ``budget``."""
    weight = weight.double()
    books = [index for index, width in enumerate(widths) if width.tier["bits"] == "codebook"]
    results = []
    for size in range(len(books) + 1):
        for dropped in combinations(books, size):
            option = [width for index, width in enumerate(widths) if index not in dropped]
            sensitivity = weight[:, None] * torch.stack([w.errors.double() for w in option], 1)
            barred = None
            if protected is not None:
                narrow = torch.tensor([w.tier["bits"] not in WIDE_ENOUGH for w in option])
                barred = protected[:, None] & narrow[None]
            choice = allocate(sensitivity, option, budget, barred)
            if choice is not None:
                results.append((float(sensitivity.gather(1, choice[:, None]).sum()), choice, option))
    if not results:
        return None, widths
    _, choice, option = min(results, key=lambda result: result[0])
    return choice, option


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
