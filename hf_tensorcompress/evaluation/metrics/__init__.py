"""The ``evaluate`` metric modules shipped with the package (mse, mae, accuracy, perplexity), loaded by path: offline,
and swappable for any other ``evaluate`` module."""

from __future__ import annotations

from pathlib import Path

import evaluate

#: Folder of the metric modules shipped with the package (``evaluate.load`` of a local path never asks the Hub).
METRICS_DIR = Path(__file__).parent


def metric_path(name: str) -> Path:
    """Folder of a shipped metric module; an error lists the ones that exist."""
    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        known = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"no metric module {name!r} in {METRICS_DIR}; shipped: {known}")
    return path


def load_metric(name: str) -> evaluate.EvaluationModule:
    """``evaluate.load`` of a shipped metric module by its folder path (offline)."""
    return evaluate.load(str(metric_path(name)), keep_in_memory=True)
