"""``compression_report`` as rows and tables (model cards, ``hf-tensorcompress report``), with an energy estimate.

Beside the model card on the save path, so it imports only ``core``: never the evaluation code, nor a method.

Energy follows the TensorSLM paper's estimate (its §2.2, Eq. 2–5): every stored weight is read from memory
once per forward (ν per float32 word) and every FLOP costs τ, with ν/τ = 5. Values are in units of τ, so only
ratios between dense and compressed are meaningful. Where a layer's report already carries ``energy`` figures
(a method that models its own memory traffic), those are used instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .core.metrics import NU_OVER_TAU, ModuleCost, estimated_energy


@dataclass
class CostRow(ModuleCost):
    """One line of a cost table: a compressed module (``type``: its layer type), or the total over them (``type``:
    the method), with the energy estimate beside the costs ``metrics.ModuleCost`` holds."""

    dense_energy: float
    energy: float


#: the integer cost fields a report entry carries for every module
_COUNTS = tuple(name for name in ModuleCost.__dataclass_fields__ if name not in ("name", "type"))


def _row(name: str, layer_type: str, entry: dict) -> CostRow:
    energy = entry.get("energy", estimated_energy(entry["bits"], entry["flops"]))
    dense_energy = entry.get("dense_energy", estimated_energy(entry["dense_bits"], entry["dense_flops"]))
    return CostRow(name, layer_type, *(int(entry[key]) for key in _COUNTS), float(dense_energy), float(energy))


def cost_rows(report: dict) -> list[CostRow]:
    """Per-module rows of a ``compression_report``, then a ``total`` row over the compressed modules."""
    rows = [_row(entry["name"], entry["type"], entry) for entry in report["modules"]]
    total = {key: sum(getattr(row, key) for row in rows) for key in (*_COUNTS, "dense_energy", "energy")}
    return rows + [CostRow("total", report["method"], **total)]


def ratio(before: float, after: float) -> str:
    return f"{after / before:.3f}" if before else "-"


def human_bytes(bits: float) -> str:
    value, unit = bits / 8, "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def summary_headers(report: dict) -> list[str]:
    """The columns of ``summary_rows``: every "dense" figure is the dense model in one precision, named here."""
    return ["", f"dense ({report.get('dense_dtype', 'float32')})", "compressed", "compressed / dense"]


def summary_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """(quantity, dense, compressed, compressed/dense) for the totals: the table a model card shows (one baseline,
    ``summary_headers``, on every line)."""
    total = cost_rows(report)[-1]
    model = report["model"]
    return [
        (
            "parameters, whole model",
            f"{model['dense_params']:,}",
            f"{model['params']:,}",
            ratio(model["dense_params"], model["params"]),
        ),
        (
            "parameters, compressed modules",
            f"{total.dense_params:,}",
            f"{total.params:,}",
            ratio(total.dense_params, total.params),
        ),
        (
            "storage, compressed modules",
            human_bytes(total.dense_bits),
            human_bytes(total.bits),
            ratio(total.dense_bits, total.bits),
        ),
        *(
            (
                f"bytes {where}, whole model",
                human_bytes(report["bytes"]["model"]["dense"] * 8),
                human_bytes(report["bytes"]["model"][key] * 8),
                ratio(report["bytes"]["model"]["dense"], report["bytes"]["model"][key]),
            )
            for where, key in (("on disk", "disk"), ("in RAM", "ram"))
            if "model" in report.get("bytes", {})
        ),
        (
            f"FLOPs per forward of {report['tokens']} token(s)/row(s), compressed modules",
            f"{total.dense_flops:,}",
            f"{total.flops:,}",
            ratio(total.dense_flops, total.flops),
        ),
        (
            f"estimated energy (ν/τ = {NU_OVER_TAU:g}, units of τ)",
            f"{total.dense_energy:,.0f}",
            f"{total.energy:,.0f}",
            ratio(total.dense_energy, total.energy),
        ),
    ]


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned table for terminals."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)) for line in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


COST_HEADERS = [
    "module",
    "type",
    "params",
    "dense params",
    "storage bits",
    "dense bits",
    "FLOPs",
    "dense FLOPs",
    "energy",
    "dense energy",
]


def cost_table_rows(report: dict) -> list[list[str]]:
    """Every module and the total, with before/after for each quantity (``hf-tensorcompress report``)."""
    return [
        [
            row.name,
            row.type,
            f"{row.params:,}",
            f"{row.dense_params:,}",
            f"{row.bits:,}",
            f"{row.dense_bits:,}",
            f"{row.flops:,}",
            f"{row.dense_flops:,}",
            f"{row.energy:,.0f}",
            f"{row.dense_energy:,.0f}",
        ]
        for row in cost_rows(report)
    ]


def _run_metrics(run: dict) -> dict[str, float]:
    """A run's metrics: its ``metrics`` dict, else its numeric top-level fields (the TensorSLM recipe's layout)."""
    source = run.get("metrics") if isinstance(run.get("metrics"), dict) else run
    return {
        key: float(value)
        for key, value in source.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "seed"
    }


def results_table(results: dict, highlight: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a recipe's ``results.json``: one row per run name, metrics averaged over seeds.

    Recipes write ``{"dataset", "runs": [{"name", "seed", "metrics": {...}, ...}]}``; the dense baseline is the
    run named ``dense``. ``highlight`` marks the run the card is about.
    """
    grouped: dict[str, list[dict[str, float]]] = {}
    for run in results.get("runs", []):
        grouped.setdefault(str(run.get("name", "run")), []).append(_run_metrics(run))
    metrics = sorted({key for runs in grouped.values() for metrics in runs for key in metrics})
    rows = []
    for name in sorted(grouped, key=lambda n: (n != "dense", n)):
        runs = grouped[name]
        cells = []
        for metric in metrics:
            values = [m[metric] for m in runs if metric in m]
            cells.append(f"{sum(values) / len(values):.4g}" if values else "")
        label = f"**{name}** (this model)" if name == highlight else name
        rows.append([label, str(len(runs)), *cells])
    return ["run", "runs averaged", *metrics], rows


def metric_names(results: dict) -> list[str]:
    """Names of the metrics a ``results.json`` reports (for the card's ``metrics`` metadata)."""
    names = {key for run in results.get("runs", []) for key in (run.get("metrics") or {})}
    return sorted(names)


BYTES_ROWS = (("compressed modules", "targets"), ("every Linear layer", "linear"), ("whole model", "model"))


def bytes_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a report's bytes on disk and in RAM, against the dense model in ``dense_dtype``."""
    dense = f"dense ({report.get('dense_dtype', 'float32')})"
    headers = ["bytes", dense, "on disk", "in RAM", "disk / dense", "RAM / dense"]
    rows = [
        [label, *(f"{report['bytes'][key][k]:,}" for k in ("dense", "disk", "ram")),
         *(f"{report['bytes'][key][k]:.3f}" for k in ("disk_ratio", "ram_ratio"))]
        for label, key in BYTES_ROWS
    ]  # fmt: skip
    return headers, rows
