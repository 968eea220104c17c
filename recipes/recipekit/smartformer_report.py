"""What the Smartformer recipe writes: ``results.json``, ``results.md`` (the paper-style table and the byte Pareto
front), and the Smartformer model with a short card."""

from __future__ import annotations

import json
import os

import torch
from transformers import AutoModel

from hf_tensorcompress.evaluation.pareto import kind_of, write_pareto
from hf_tensorcompress.evaluation.tables import runs_table
from hf_tensorcompress.reporting import markdown_table
from hf_tensorcompress.runtime.atomic import atomic_folder

from .costs import bytes_cell

#: Columns of the table besides the metrics: run field -> header.
COLUMNS = {
    "params": "params",
    "attention_params": "attention params",
    "attention_ratio": "attention / dense",
    "attention_disk": "q/k/v bytes on disk (/ fp32)",
    "attention_ram": "q/k/v bytes in RAM",
    "linear_disk": "every Linear: bytes on disk (/ fp32)",
    "linear_ram": "every Linear: bytes in RAM",
    "model_flops": "model FLOPs per window",
    "flops": "q/k/v FLOPs per token",
    "steps": "steps",
}


def markdown(results: dict) -> str:
    """Mean (± std) over seeds per run name, like the paper's tables; every run trained for the same steps."""
    dense = next((r["attention_params"] for r in results["runs"] if r["name"] == "dense"), None)
    runs = [
        {
            **run,
            "metrics": {**run["metrics"], "seconds": run["train_seconds"]},
            "attention_ratio": f"{run['attention_params'] / dense:.2f}" if dense else "-",
            **{
                f"{kind}_{where}": bytes_cell(run[f"{kind}_bytes"], where)
                for kind in ("attention", "linear")
                for where in ("disk", "ram")
            },
        }
        for run in results["runs"]
    ]
    table = runs_table(runs, {"mse": "MSE", "mae": "MAE", "seconds": "train s"}, COLUMNS)
    return (
        f"### {results['model']} on {results['dataset']}, horizon {results['horizon']}\n\n{table}\n"
        f"{naive_table(results)}"
        f"Every run: {results['steps']} optimizer steps{batch_phrase(results)}, scored with the weights of its best validation MSE "
        f"(checked every {results['validate_every']} steps){'; --keep-last: final weights' if results['keep_last'] else ''}.\n"
    )


def batch_phrase(results: dict) -> str:
    """The batch and training-window stride of every run, where the results say (older results files do not)."""
    if "batch_size" not in results:
        return ""
    return f" of batch {results['batch_size']} (training windows every {results['train_stride']} steps)"


def naive_table(results: dict) -> str:
    """The naive forecasts on the same test windows, beside the arms: a trained model should beat them clearly."""
    naive = results.get("naive")
    if not naive:
        return ""
    rows = [[name, f"{values['mse']:.4f}", f"{values['mae']:.4f}"] for name, values in naive.items()]
    return (
        "Naive forecasts on the same test windows (last-season-N: the last N steps repeated):\n\n"
        + markdown_table(["naive forecast", "MSE", "MAE"], rows)
        + "\n\n"
    )


def write_results(results: dict, output_dir: str) -> None:
    """``results.json``; written after every run too, so a long job's finished runs are kept."""
    with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)


def write_tables(results: dict, output_dir: str, seeds: int) -> str:
    """``results.md``: the table, and the best test MSE within each byte budget when baselines ran; returns it."""
    table = markdown(results)
    if any("linear_bytes" in run and kind_of(run["name"]) == "baseline" for run in results["runs"]):
        title = f"{results['model']} on {results['dataset']}, horizon {results['horizon']}, {seeds} seeds"
        table += "\n### Best test MSE within each byte budget (every Linear weight)\n\n"
        table += write_pareto(results["runs"], "mse", output_dir, title, lower_is_better=True)
        table += "\nFigure: bytes_pareto.png (numbers: bytes_pareto.json).\n"
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    return table


def save_smartformer(model: torch.nn.Module, results: dict, folder: str) -> None:
    """``save_pretrained`` (remote code included) plus a short model card, written together into a staging folder
    that replaces ``folder`` (``atomic_folder``), then a check that it loads back."""
    with atomic_folder(folder) as staging:
        write_smartformer(model, results, staging)
    AutoModel.from_pretrained(folder, trust_remote_code=True)


def write_smartformer(model: torch.nn.Module, results: dict, folder: str | os.PathLike) -> None:
    """The model and its card, into ``folder``."""
    model.save_pretrained(folder)
    smart = [r for r in results["runs"] if r["name"] == "smartformer"]
    card = [
        "---",
        "library_name: transformers",
        "tags: [time-series-forecasting, hf_tensorcompress, smartformer]",
        "---",
        "",
        f"# Smartformer {results['model']} ({results['dataset']}, horizon {results['horizon']})",
        "",
        "CP-decomposed attention projections with ranks chosen by the Smartformer reinforcement-learning search.",
        "Load with `AutoModel.from_pretrained(path, trust_remote_code=True)`; hf_tensorcompress is not needed.",
        "",
        f"Chosen ranks: `{json.dumps(smart[0]['ranks'])}`",
        "",
        markdown(results),
    ]
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(card))
