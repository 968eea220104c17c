"""What the SBT recipe measures of a run and writes: ``results.json`` and ``results.md`` (with the byte Pareto front)."""

from __future__ import annotations

import json
from pathlib import Path

from hf_tensorcompress.core.metrics import nonzero_flops, storage_bits
from hf_tensorcompress.evaluation.pareto import kind_of, write_pareto
from hf_tensorcompress.evaluation.tables import runs_table

from .costs import bytes_cell, every_linear_bytes


def measure(
    model,
    name: str,
    keep_ratio: float | None,
    seed: int,
    metrics: dict,
    outcome,
    sample,
    checkpoint: Path | None,
    packed: dict[str, int] | None = None,
) -> dict:
    """One row of ``results.json``: the run's metrics, budget and costs (``packed``: the deployed bytes of layers
    stored in another form than they trained in)."""
    linear = every_linear_bytes(model, packed)
    return {
        "name": name,
        "keep_ratio": keep_ratio if keep_ratio is not None else 1.0,
        "seed": seed,
        "metrics": metrics,
        "steps": outcome.steps,
        "selected_step": outcome.selected_step,
        "params": sum(
            m.binary_parameters()
            if hasattr(m, "binary_parameters")
            else sum(p.numel() for p in m.parameters(recurse=False))
            for m in model.modules()
        ),
        "storage_bits": storage_bits(model),
        "nonzero_flops": nonzero_flops(model.eval(), **sample)["total"],
        "checkpoint_bytes": None
        if checkpoint is None
        else sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")),
        "linear_bytes": linear,
        "train_seconds": round(outcome.seconds, 2),
    }


def write_results(results: dict, out: Path, args) -> str:
    """``results.json`` and ``results.md`` into ``out``; returns the markdown."""
    metric_names = list(results["runs"][0]["metrics"])
    runs = [
        run | {where: bytes_cell(run["linear_bytes"], where) for where in ("disk", "ram")} for run in results["runs"]
    ]
    table = runs_table(
        runs,
        {m: m for m in metric_names},
        {
            "keep_ratio": "keep_ratio",
            "steps": "steps",
            "params": "params",
            "storage_bits": "storage_bits",
            "disk": "every Linear: bytes on disk (/ fp32)",
            "ram": "every Linear: bytes in RAM",
            "nonzero_flops": "nonzero_flops",
            "checkpoint_bytes": "checkpoint_bytes",
        },
    )
    selected = {run["name"]: [] for run in results["runs"]}
    for run in results["runs"]:
        selected[run["name"]].append(str(run["selected_step"]))
    note = (
        f"\nEvery arm: {args.steps} optimizer steps (batch {args.batch_size}), weights lr {args.learning_rate:g}, biprop "
        f"scores lr {args.score_learning_rate:g}; scored with the weights of its best validation check (every "
        f"{args.validate_every} steps). Selected steps per seed: "
        + "; ".join(f"{name} {', '.join(steps)}" for name, steps in selected.items())
        + ".\n"
    )
    baseline = results.get("persistence_baseline")
    if baseline:
        note += f"\nPersistence baseline (x_t = x_(t-1)) on the same test windows: {baseline}\n"
    text = f"# SBT {args.task}: {results['dataset']}\n\n" + table + note
    metric = {"classification": ("accuracy", False), "forecasting": ("mse", True)}.get(args.task)
    if metric and any(kind_of(run["name"]) == "baseline" for run in results["runs"]):
        text += f"\n## Best test {metric[0]} within each byte budget (every Linear weight)\n\n"
        text += write_pareto(
            results["runs"],
            metric[0],
            out,
            f"SBT {args.task}: {results['dataset']}, {len(args.seeds)} seeds",
            lower_is_better=metric[1],
        )
        text += "\nFigure: bytes_pareto.png (numbers: bytes_pareto.json).\n"
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(text)
    return text
