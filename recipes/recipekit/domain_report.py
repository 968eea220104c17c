"""What the cross-domain TensorSLM recipe reports: the Δ ln PPL tables (per pair, across domains, in bytes) and
the two figures."""

from __future__ import annotations

from pathlib import Path

from hf_tensorcompress.core.extras import require


def table(results: dict) -> str:
    """One row per (ratio, arm, calibration corpus), one Δ ln PPL column per evaluation corpus, then the mean over
    the evaluation corpora other than the calibration corpus (all of them for arms without calibration)."""
    names = list(results["corpora"])
    lines = [
        "| arm | calibration | smaller than bf16 | "
        + " | ".join(f"Δ {name}" for name in names)
        + " | mean, other domains |",
        "|---|---|---|" + "---|" * (len(names) + 1),
    ]
    rows: dict[tuple, dict] = {}
    for run in results["runs"]:
        rows.setdefault((run["target_ratio"], run["arm"], run["calibration"]), {})[run["evaluation"]] = run
    for (_, arm, source), cells in rows.items():
        ratio = next(iter(cells.values()))["smaller_than_bf16"]
        other = [cells[name]["delta_ln_ppl"] for name in names if name != source and name in cells]
        values = " | ".join(
            f"{cells[name]['delta_ln_ppl']:.3f}" + (" (in)" if name == source else "") if name in cells else ""
            for name in names
        )
        mean = f"{sum(other) / len(other):.3f}" if other else ""
        lines.append(f"| {arm} | {source or '—'} | {ratio:.2f}× | {values} | {mean} |")
    return "\n".join(lines) + "\n"


def summary(results: dict) -> str:
    """One row per (ratio, arm): mean Δ ln PPL in domain (calibration corpus = evaluation corpus), mean and worst
    across domains (every other pair; every pair for arms without calibration)."""
    lines = [
        "| arm | smaller than bf16 | in domain, mean | across domains, mean | across domains, worst |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple, list] = {}
    for run in results["runs"]:
        groups.setdefault((run["target_ratio"], run["arm"]), []).append(run)
    for (_, arm), runs in groups.items():
        inside = [run["delta_ln_ppl"] for run in runs if run["calibration"] == run["evaluation"]]
        across = [run["delta_ln_ppl"] for run in runs if run["calibration"] != run["evaluation"]]
        ratio = min(run["smaller_than_bf16"] for run in runs)
        lines.append(
            f"| {arm} | {ratio:.2f}× | {f'{sum(inside) / len(inside):.3f}' if inside else '—'} | "
            f"{sum(across) / len(across):.3f} | {max(across):.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Δ ln PPL (log scale) against the target compression ratio per arm: mean over the pairs across domains
    (solid), in domain (dashed)."""
    matplotlib = require("matplotlib", "the cross-domain figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    arm_names = list(dict.fromkeys(run["arm"] for run in results["runs"] if run["target_ratio"] is not None))
    for index, arm in enumerate(arm_names):
        color = f"C{index % 10}"
        for inside, style in ((False, "-o"), (True, "--x")):
            points: dict[float, list] = {}
            for run in results["runs"]:
                if (
                    run["arm"] == arm
                    and run["target_ratio"] is not None
                    and (run["calibration"] == run["evaluation"]) == inside
                ):
                    points.setdefault(run["target_ratio"], []).append(run["delta_ln_ppl"])
            if points:
                xs = sorted(points)
                ax.plot(
                    xs,
                    [max(sum(points[x]) / len(points[x]), 1e-3) for x in xs],
                    style,
                    color=color,
                    label=f"{arm}{' (in domain)' if inside else ' (across domains)'}",
                )
    ax.axhline(0.10, color="gray", linestyle=":", label="Δ 0.10")
    ax.set_yscale("log")
    ax.set_xlabel("target times smaller than the bf16 embedding in bytes (values counted as bf16: = parameter ratio)")
    ax.set_ylabel("Δ ln perplexity vs dense (held-out)")
    ax.set_title("Token-embedding compression across domains: " + Path(results["model"]).name)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def byte_points(results: dict) -> list[dict]:
    """One point per (arm, size): bytes vs bf16 and Δ ln PPL across domains (mean, worst; every pair for arms without
    calibration), in domain (mean), and whether it is on the Pareto front (no other point is as small or smaller
    with a lower mean across domains)."""
    groups: dict[tuple, list] = {}
    for run in results["runs"]:
        groups.setdefault((run["target_ratio"], run["arm"]), []).append(run)
    points = []
    for (_, arm), runs in groups.items():
        across = [run["delta_ln_ppl"] for run in runs if run["calibration"] != run["evaluation"]]
        inside = [run["delta_ln_ppl"] for run in runs if run["calibration"] == run["evaluation"]]
        points.append(
            {
                "arm": arm,
                "smaller_than_bf16": min(run["smaller_than_bf16"] for run in runs),
                "embedding_bytes": max(run["embedding_bytes"] for run in runs),
                "across_mean": sum(across) / len(across),
                "across_worst": max(across),
                "in_domain_mean": sum(inside) / len(inside) if inside else None,
                "calibrated": any(run["calibration"] for run in runs),
            }
        )
    for point in points:
        point["pareto"] = not any(
            other is not point
            and other["smaller_than_bf16"] >= point["smaller_than_bf16"]
            and other["across_mean"] < point["across_mean"]
            for other in points
        )
    return sorted(points, key=lambda point: point["smaller_than_bf16"])


def byte_summary(results: dict) -> str:
    """Every arm by size in bytes (bf16 = 1×): Δ ln PPL across domains (mean, worst), in domain, Pareto front."""
    lines = [
        "| arm | smaller than bf16 | MB | across domains, mean | across domains, worst | in domain, mean | Pareto |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in byte_points(results):
        inside = f"{point['in_domain_mean']:.3f}" if point["in_domain_mean"] is not None else "—"
        lines.append(
            f"| {point['arm']} | {point['smaller_than_bf16']:.2f}× | {point['embedding_bytes'] / 1e6:.2f} | "
            f"{point['across_mean']:.3f} | {point['across_worst']:.3f} | {inside} | "
            f"{'★' if point['pareto'] else ''} |"
        )
    return "\n".join(lines) + "\n"


def plot_bytes(results: dict, path: Path) -> None:
    """Δ ln PPL across domains (mean; bar up to the worst pair) against how many times smaller than bf16 each arm
    stores the embedding; the Pareto front joined."""
    matplotlib = require("matplotlib", "the cross-domain figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = byte_points(results)

    def family(arm: str) -> str:  # the library, or this library's method
        return "tiered (this library)" if arm.startswith(("tiered", "rows")) else arm.split("-")[0]

    families = list(dict.fromkeys(family(point["arm"]) for point in points))
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for point in points:
        color = f"C{families.index(family(point['arm'])) % 10}"
        x, y = point["smaller_than_bf16"], max(point["across_mean"], 1e-3)
        ax.errorbar(
            x,
            y,
            yerr=[[0], [max(point["across_worst"], 1e-3) - y]],
            fmt="o",
            color=color,
            capsize=2,
            markersize=7 if point["pareto"] else 4,
            markeredgecolor="black" if point["pareto"] else color,
        )
        ax.annotate(point["arm"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    front = [point for point in points if point["pareto"]]
    ax.plot(
        [p["smaller_than_bf16"] for p in front],
        [max(p["across_mean"], 1e-3) for p in front],
        "k--",
        lw=0.8,
        label="Pareto front (mean across domains)",
    )
    for index, family in enumerate(families):
        ax.plot([], [], "o", color=f"C{index % 10}", label=family)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×" if x in (3, 4, 6) else ""))
    ax.set_xlabel("times smaller than the bf16 embedding (bytes on disk and in memory)")
    ax.set_ylabel("Δ ln perplexity vs dense, other domains (mean; bar: worst pair)")
    ax.set_title("Token embedding: quantization vs this library's options, " + Path(results["model"]).name)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
