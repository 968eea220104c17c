"""The one markdown table every recipe writes: a row per run name, metrics as mean ± std over seeds (the sample
standard deviation, ddof=1, said under the table), then the details that do not vary with the seed (parameters,
steps, …) from the first run."""

from __future__ import annotations

import numpy as np

from ..reporting import markdown_table


def _cell(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def runs_table(runs: list[dict], metrics: dict[str, str], details: dict[str, str], digits: int = 4) -> str:
    """``metrics``: key in ``run["metrics"]`` -> header; ``details``: key in ``run`` -> header. Runs sharing a
    ``name`` are seeds of one configuration; a configuration of one seed shows the value without ± std. When a row
    has several seeds, a line under the table says what ± is."""
    grouped: dict[str, list[dict]] = {}
    for run in runs:
        grouped.setdefault(run["name"], []).append(run)
    rows = []
    for name, group in grouped.items():
        cells = [name, str(len(group))]
        for key in metrics:
            values = np.array([run["metrics"][key] for run in group if key in run["metrics"]], dtype=float)
            if len(values) == 0:
                cells.append("")
            elif len(values) == 1:
                cells.append(f"{values[0]:.{digits}f}")
            else:
                cells.append(f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}")
        cells += [_cell(group[0].get(key)) for key in details]
        rows.append(cells)
    table = markdown_table(["run", "seeds", *metrics.values(), *details.values()], rows) + "\n"
    return table + spread_note([len(group) for group in grouped.values()])


def spread_note(seed_counts: list[int]) -> str:
    """The line that labels ``±``: mean ± sample std (ddof=1) over the seeds of a row ("" when no row has two)."""
    counts = sorted({count for count in seed_counts if count > 1})
    if not counts:
        return ""
    over = f"{counts[0]} seeds" if len(counts) == 1 else "the seeds in column 'seeds'"
    return f"\nValues: mean ± std over {over} (sample standard deviation, ddof=1).\n"
