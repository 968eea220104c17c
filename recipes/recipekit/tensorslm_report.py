"""The TensorSLM sweep's figure: ln perplexity against compression ratio per kind of run."""

from __future__ import annotations

import math
from pathlib import Path

from hf_tensorcompress.core.extras import require


def plot(results: dict, path: Path) -> None:
    """ln PPL against compression ratio: TT tied, TT untied, SVD, with the dense model as a line."""
    matplotlib = require("matplotlib", "the TT recipe's figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    runs = results["runs"]
    tt = [r for r in runs if r["method"] == "tt"]
    tied = [r for r in tt if r["output_layer"] == "tt (tied)"]
    groups = {
        "TT plain (tied, output from cores)": [
            r for r in tied if r["tt_basis"] == "identity" and not r.get("heal_steps")
        ],
        "TT PCA basis (tied)": [r for r in tied if r["tt_basis"] == "pca"],
        "TT output-aware basis (tied)": [r for r in tied if r["tt_basis"] == "output" and not r["tt_exact_tokens"]],
        "TT output-aware + frequent tokens dense (tied)": [
            r for r in tied if r["tt_exact_tokens"] and not r.get("heal_steps")
        ],
        "TT healed by distillation (tied)": [r for r in tied if r.get("heal_steps")],
        "TT plain, dense untied output": [r for r in tt if r["output_layer"] != "tt (tied)"],
        "matrix SVD (tied)": [r for r in runs if r["method"] == "svd"],
        "frequency-only (same size)": [r for r in runs if r["method"] == "frequency-only"],
        "same dense rows + SVD tail (same size)": [r for r in runs if r["method"] == "rows+svd"],
    }
    for (label, group), marker in zip(groups.items(), "o^DP*sxvh"):
        group = sorted(group, key=lambda r: r["compression_ratio"])
        if group:
            ax.plot(
                [r["compression_ratio"] for r in group],
                [math.log(r["perplexity"]) for r in group],
                marker=marker,
                label=label,
            )
    dense = next(r for r in runs if r["method"] == "dense")
    ax.axhline(math.log(dense["perplexity"]), color="gray", linestyle="--", label="dense")
    ax.set_xlabel("times smaller than the bf16 embedding in bytes (values counted as bf16: = parameter ratio)")
    ax.set_ylabel("ln perplexity (held-out)")
    ax.set_title("TensorSLM on " + Path(results["model"]).name)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
