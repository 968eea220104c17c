"""Test metric against bytes: every arm of a run, the quantization baselines' Pareto front, and where this library's
options stand against it at each byte budget (the question a user asks: what is the best I can get at N bytes?)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..core.extras import require
from ..reporting import markdown_table

#: Arms that are what a user would pick instead (weight-only PTQ, low-bit QAT) and the uncompressed model.
BASELINE_PREFIXES = ("ptq-", "qat-")
#: Byte budgets (fraction of fp32) at which the library's best is compared with the baselines' best.
BUDGETS = (1 / 4, 1 / 6, 1 / 8, 1 / 12, 1 / 16, 1 / 24, 1 / 32)


def kind_of(name: str) -> str:
    """``dense``, ``baseline`` (quantization) or ``library`` (an option this library builds)."""
    if name == "dense":
        return "dense"
    return "baseline" if name.startswith(BASELINE_PREFIXES) else "library"


def arm_points(runs: list[dict], metric: str, bytes_of=lambda run: run["linear_bytes"]["disk_ratio"]) -> list[dict]:
    """One point per run name: mean and sample std (ddof=1; 0 for one seed) of ``metric`` over its seeds, mean
    bytes (fraction of fp32)."""
    grouped: dict[str, list[dict]] = {}
    for run in runs:
        grouped.setdefault(run["name"], []).append(run)
    return [
        {
            "name": name,
            "kind": kind_of(name),
            "seeds": len(group),
            "metric": float(np.mean([run["metrics"][metric] for run in group])),
            "std": float(np.std([run["metrics"][metric] for run in group], ddof=1)) if len(group) > 1 else 0.0,
            "bytes": float(np.mean([bytes_of(run) for run in group])),
        }
        for name, group in grouped.items()
    ]


def front(points: list[dict], lower_is_better: bool) -> list[dict]:
    """The Pareto front of ``points`` (fewer bytes and a better metric), by bytes."""
    sign = 1 if lower_is_better else -1
    kept, best = [], np.inf
    for point in sorted(points, key=lambda p: (p["bytes"], sign * p["metric"])):
        if sign * point["metric"] < best:
            kept.append(point)
            best = sign * point["metric"]
    return kept


def best_within(points: list[dict], budget: float, lower_is_better: bool) -> dict | None:
    """The best point whose bytes are at most ``budget`` (fraction of fp32), or None."""
    inside = [p for p in points if p["bytes"] <= budget * (1 + 1e-9)]
    if not inside:
        return None
    return min(inside, key=lambda p: p["metric"]) if lower_is_better else max(inside, key=lambda p: p["metric"])


def budget_rows(points: list[dict], lower_is_better: bool) -> list[dict]:
    """At every budget of ``BUDGETS``: the best quantization baseline, the best library option, and whether the
    library's is at least as good (``None`` where one side has no arm that small)."""
    baselines = [p for p in points if p["kind"] == "baseline"]
    library = [p for p in points if p["kind"] == "library"]
    rows = []
    for budget in BUDGETS:
        base, ours = best_within(baselines, budget, lower_is_better), best_within(library, budget, lower_is_better)
        at_least = None
        if base is not None and ours is not None:
            at_least = ours["metric"] <= base["metric"] if lower_is_better else ours["metric"] >= base["metric"]
        rows.append({"budget": budget, "baseline": base, "library": ours, "library_at_least_as_good": at_least})
    return rows


def budget_table(rows: list[dict], metric: str) -> str:
    """Markdown: per budget, the best baseline and the best library option with their metric and bytes."""

    def cell(point: dict | None) -> str:
        return (
            "none this small" if point is None else f"{point['name']}: {point['metric']:.4f} at {point['bytes']:.3f}×"
        )

    body = [
        [
            f"1/{round(1 / row['budget'])}",
            cell(row["baseline"]),
            cell(row["library"]),
            {True: "yes", False: "no", None: "-"}[row["library_at_least_as_good"]],
        ]
        for row in rows
    ]
    return markdown_table(
        [
            "bytes budget (of fp32)",
            f"best PTQ/QAT arm ({metric})",
            f"best library option ({metric})",
            "library ≥ baseline",
        ],
        body,
    )


def plot_pareto(
    points: list[dict],
    path: str | Path,
    metric_label: str,
    title: str,
    lower_is_better: bool,
    dense: dict | None = None,
) -> None:
    """Metric against bytes of every Linear (log axis, fp32 = 1): every arm (mean ± std over seeds), the
    quantization baselines' front as a step line, the front of all arms circled, dense as a horizontal line."""
    plt = require("matplotlib.pyplot", "the bytes-vs-metric figure")
    figure, axis = plt.subplots(figsize=(8.5, 5.5))
    styles = {
        "baseline": ("tab:orange", "s", "PTQ / QAT (torchao, ternary)"),
        "library": ("tab:blue", "o", "this library"),
        "dense": ("black", "D", "dense fp32"),
    }
    for kind, (color, marker, label) in styles.items():
        chosen = [p for p in points if p["kind"] == kind]
        if chosen:
            axis.errorbar(
                [p["bytes"] for p in chosen],
                [p["metric"] for p in chosen],
                yerr=[p["std"] for p in chosen],
                fmt=marker,
                color=color,
                label=label,
                alpha=0.8,
                capsize=2,
                markersize=5,
            )
    baseline_front = front([p for p in points if p["kind"] in ("baseline", "dense")], lower_is_better)
    if baseline_front:
        xs = [p["bytes"] for p in baseline_front]
        ys = [p["metric"] for p in baseline_front]
        axis.step(xs, ys, where="post", color="tab:orange", linestyle="--", label="PTQ/QAT Pareto front")
    overall = front(points, lower_is_better)
    axis.scatter(
        [p["bytes"] for p in overall],
        [p["metric"] for p in overall],
        s=160,
        facecolors="none",
        edgecolors="red",
        label="Pareto front, all arms",
        zorder=3,
    )
    for point in points:
        axis.annotate(
            point["name"],
            (point["bytes"], point["metric"]),
            fontsize=6,
            alpha=0.7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    if dense is not None:
        axis.axhline(dense["metric"], color="black", linewidth=0.8, linestyle=":")
    for budget in (1 / 4, 1 / 8, 1 / 32):
        axis.axvline(budget, color="grey", linewidth=0.5, linestyle=":")
    axis.set_xscale("log")
    axis.set_xlabel("bytes of every Linear weight on disk (fraction of fp32; grey: 1/4, 1/8, 1/32)")
    axis.set_ylabel(metric_label)
    axis.set_title(title)
    axis.legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=130)
    plt.close(figure)


def write_pareto(runs: list[dict], metric: str, folder: str | Path, title: str, lower_is_better: bool) -> str:
    """``bytes_pareto.png`` and ``bytes_pareto.json`` in ``folder``; returns the budget table (markdown)."""
    points = arm_points(runs, metric)
    rows = budget_rows(points, lower_is_better)
    dense = next((p for p in points if p["kind"] == "dense"), None)
    plot_pareto(points, Path(folder) / "bytes_pareto.png", f"test {metric}", title, lower_is_better, dense)
    summary = {
        "metric": metric,
        "lower_is_better": lower_is_better,
        "points": points,
        "budgets": rows,
        "front": [p["name"] for p in front(points, lower_is_better)],
    }
    (Path(folder) / "bytes_pareto.json").write_text(json.dumps(summary, indent=2) + "\n")
    return budget_table(rows, metric)
