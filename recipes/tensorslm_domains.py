"""TensorSLM across domains: calibrate on one corpus, score perplexity on the held-out part of every corpus, for TT
token embeddings and the simple baselines at the same parameter count.

    accelerate launch recipes/tensorslm_domains.py --output-dir out/domains [--model DIR] \\
        [--corpus NAME=DIR ...] [--mail-corpus NAME ...] [--ratios 2]

Every corpus (a folder of JSON documents with a ``text`` field; default: Moby Dick, the State of the Union
addresses and SpamAssassin mails) is split by documents: the last ``--held-out-fraction`` is evaluation text, the
rest calibration text, so calibration and evaluation text never overlap, in or across domains. For each target
compression ratio the TT arm (ranks 1,1, output-aware basis, the most frequent tokens dense, as many as the ratio
allows) sets the budget, and every other arm gets at most its parameters (dense rows, factors, basis and fill
row all counted):

- ``svd``: the whole matrix at rank ``k`` (no calibration);
- ``freq-calib`` / ``freq-id``: frequency-only: the most frequent tokens keep their rows, the rest share their
  mean row; frequency from the calibration text, or the tokenizer's merge order (lowest ids, no calibration);
- ``rows+svd-calib``: the TT arm's dense rows, the remaining rows as a rank-``k`` SVD;
- ``rows+svd-output-calib`` / ``-id`` / ``-mixed``: the same SVD taken in the output-aware metric ``W C^{1/2}``
  (calibration covariance), dense rows by calibration counts, lowest ids or half of each (``tt_exact_prior``);
- ``tt-calib`` / ``tt-id`` / ``tt-mixed``: TT of order 3 (SmolLM2: 8×8×9) at ranks 1,1, output-aware basis, dense rows by
  ``tt_exact_prior`` ``"calibration"``, ``"token_id"`` or ``"mixed"``; ``tt-r33-calib``: the same at ranks 3,3
  with fewer dense rows (calibration counts);
- ``tt-plain`` (at 2× only): TT ranks 5,5, no basis, no dense rows, no calibration.

Bytes (``--byte-arms``, ``all`` for every one): weight-only quantization of the same tied embedding through
maintained libraries (``evaluation.quantized_embedding.QUANT_ARMS``: torchao int8, bitsandbytes int8 / NF4 / FP4,
gguf Q8_0 / Q5_0 / Q4_1 / Q4_0; hand-written round-to-nearest for int3 / int2, which none of them stores) and the
``method="tiered"`` settings of ``TIERED_ARMS`` and the 2× ``tt-calib`` arm with int8 / int4 storage (``TT_BYTE_ARMS``,
``tt_storage_bits``); every arm is sized in bytes (bf16 = 1×; parameter-budget arms count
2 bytes a parameter). ``--ratios`` with no value runs only these.

Arms without calibration are scored once per evaluation corpus. Writes ``results.json``, ``table.md`` (Δ ln PPL,
calibration corpus × evaluation corpus, then per arm the mean in domain and the mean and worst across domains, then
every arm by bytes with the Pareto front), ``domains.png`` (Δ ln PPL against compression ratio per arm, in and across
domains; parameter-budget arms) and ``bytes.png`` (Δ ln PPL across domains against bytes, Pareto front marked) to
``--output-dir``. The default model is SmolLM2-135M-Instruct from its GGUF (block linears Q4_1, tied embedding Q8_0,
dequantised; see ``causal_lm.WEIGHTS_NOTE``).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.data.causal_lm import WEIGHTS_NOTE, smollm2_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.evaluation.perplexity import perplexity
from hf_tensorcompress.evaluation.quantized_embedding import QUANT_ARMS, quantize_embedding
from hf_tensorcompress.extras import require
from hf_tensorcompress.methods.tt.baselines import (
    dense_rows_svd_tail,
    frequency_only,
    rows_for_budget,
    tail_rank_for,
)
from hf_tensorcompress.methods.tt.calibration import TTCalibration, exact_token_ids, hidden_covariance
from hf_tensorcompress.methods.tt.energy import apply_svd_embedding, svd_rank_for
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.solver import balanced_shape

#: ``method="tiered"`` settings of the byte comparison (``--byte-arms``), from 2× to 12× smaller than bf16. Tokens
#: are tiered by id (BPE merge order: no domain in it); ``rounding="output"`` uses the calibration corpus's
#: hidden-state covariance. ``rows16+svd``: dense (bf16) rows + output-aware SVD of the others, the README's 2× arm.
TIERED_ARMS: dict[str, dict] = {
    "tiered-int4": dict(tier_bits=[4], rounding="output"),
    "tiered-int4/int3-24k": dict(tier_tokens=[24000], tier_bits=[4, 3], rounding="output"),
    "tiered-int4/int3-20k": dict(tier_tokens=[20000], tier_bits=[4, 3], rounding="output"),
    "tiered-int4/int3-8k": dict(tier_tokens=[8192], tier_bits=[4, 3], rounding="output"),
    "tiered-int3": dict(tier_bits=[3], rounding="output"),
    "tiered-int4/int3g192-4k": dict(tier_tokens=[4096], tier_bits=[4, 3], tier_group_size=[64, 192], rounding="output"),
    "rows16+svd": dict(tier_tokens=[21866], tier_bits=[16, 0], low_rank=55, low_rank_bits=16, rounding="output"),
    "rows-int4+svd-16k": dict(tier_tokens=[16384], tier_bits=[4, 0], low_rank=128, rounding="output"),
    "rows-int4+svd-12k": dict(tier_tokens=[12288], tier_bits=[4, 0], low_rank=128, rounding="output"),
    "rows-int4+svd-6k": dict(tier_tokens=[6144], tier_bits=[4, 0], low_rank=64, rounding="output"),
    "tiered-codebook": dict(tier_bits=["codebook"], rounding="output"),
    "tiered-int4/codebook-2k": dict(tier_tokens=[2000], tier_bits=[4, "codebook"], rounding="output"),
}

#: The ``tt-calib`` arm at 2× (ranks 1,1, output-aware basis, dense rows by calibration counts) with its trains, dense
#: rows and basis stored as low-bit codes (``tt_storage_bits``), compared in bytes (``--byte-arms``).
TT_BYTE_ARMS: dict[str, dict] = {
    "tt-calib-int8": dict(tt_storage_bits=8),
    "tt-calib-int4": dict(tt_storage_bits=4, tt_storage_group_size=64),
}
BYTE_ARMS = [*QUANT_ARMS, *TIERED_ARMS, *TT_BYTE_ARMS]


def train_parameters(hidden: int, ranks: list[int]) -> int:
    """``Σ_k r_{k-1} I_k r_k`` of one token's train of order 3 at ``ranks``."""
    shape, bounds = balanced_shape(hidden, 3), [1, *ranks, 1]
    return sum(bounds[k] * shape[k] * bounds[k + 1] for k in range(3))


def exact_for_ratio(vocab: int, hidden: int, ratio: float, ranks: list[int] = (1, 1)) -> int:
    """Dense rows that bring TT at ``ranks`` + output-aware basis (``d²``) to ``ratio``: trains of every token, the
    basis and the rows together fill ``V·d / ratio``."""
    budget = vocab * hidden / ratio - vocab * train_parameters(hidden, list(ranks)) - hidden * hidden
    if budget < 0:
        raise ValueError(f"ratio {ratio} is beyond TT ranks {list(ranks)} with an output-aware basis")
    return int(budget // hidden)


def corpora(args) -> dict[str, tuple]:
    """name → (calibration dataset, held-out dataset)."""
    from hf_tensorcompress import assets

    given = (
        dict(item.split("=", 1) for item in args.corpus)
        if args.corpus
        else {"moby_dick": str(assets.moby_dick_dir()), "sotu": str(assets.sotu_dir()), "mail": str(assets.mail_dir())}
    )
    mail = set(args.mail_corpus if args.corpus else ["mail"])
    unknown = mail - set(given)
    if unknown:
        raise ValueError(f"--mail-corpus {sorted(unknown)} names no --corpus (given: {sorted(given)})")
    return {
        name: split_documents(text_dataset(folder, mail_bodies=name in mail), args.held_out_fraction)
        for name, folder in given.items()
    }


def score(model, ids: torch.Tensor, args) -> float:
    head = model.get_output_embeddings()
    if isinstance(head, TTTiedHead):
        head.mode = "cached"  # evaluation under no_grad: rebuild the tied matrix once, not per window
    return perplexity(model, ids, window=args.window, stride=args.stride)["ln_perplexity"]


def tt_arm(prior: str, exact: int, ranks: list[int], storage: dict | None = None):
    """build(model, calibration) → parameters, or stored bytes with low-bit ``storage`` (``TT_BYTE_ARMS``)."""

    def build(model, calibration):
        config = CompressionConfig(
            method="tt",
            tt_order=3,
            tt_ranks=ranks,
            tt_basis="output",
            tt_exact_tokens=exact,
            tt_exact_prior=prior,
            tt_solver="eigh",
            **(storage or {}),
        )
        apply_compression(model, config, calibration=calibration)
        layer = model.get_input_embeddings()
        return layer.effective_parameters() if storage is None else layer.storage_bits() // 8

    return build


def byte_arms(names: list[str], vocab: int, hidden: int) -> list[tuple[str, bool, object]]:
    """(name, needs calibration, build(model, calibration) → stored bytes) of the quantization arms
    (``QUANT_ARMS``, maintained libraries), the tiered method's settings (``TIERED_ARMS``) and TT with low-bit
    storage (``TT_BYTE_ARMS``)."""
    runs = []
    for name in names:
        if name in QUANT_ARMS:
            runs.append((name, False, lambda model, _, arm=name: quantize_embedding(model, arm)))
            continue
        if name in TT_BYTE_ARMS:
            exact = exact_for_ratio(vocab, hidden, 2)
            runs.append((name, True, tt_arm("calibration", exact, [1, 1], TT_BYTE_ARMS[name])))
            continue
        config = CompressionConfig(method="tiered", **TIERED_ARMS[name])

        def build(model, calibration, config=config):
            apply_compression(model, config, calibration=calibration)
            return model.get_input_embeddings().storage_bits() // 8

        runs.append((name, config.needs_calibration(), build))
    return runs


def arms(vocab: int, hidden: int, ratio: float) -> list[tuple[str, bool, object]]:
    """(name, needs calibration, build(model, calibration) → parameters) at ``ratio``; the first sets the budget."""
    exact = exact_for_ratio(vocab, hidden, ratio)
    budget = vocab * train_parameters(hidden, [1, 1]) + hidden * hidden + exact * hidden
    keep, tail_rank = rows_for_budget(hidden, budget), tail_rank_for(vocab, hidden, exact, budget)

    def calibrated_rows(calibration, prior):
        return exact_token_ids(calibration.counts, exact, prior)

    runs = [
        ("tt-calib", True, tt_arm("calibration", exact, [1, 1])),
        ("tt-mixed", True, tt_arm("mixed", exact, [1, 1])),
        ("tt-id", True, tt_arm("token_id", exact, [1, 1])),
        ("svd", False, lambda model, _: apply_svd_embedding(model, svd_rank_for(vocab, hidden, budget))),
        ("freq-calib", True, lambda model, c: frequency_only(model, exact_token_ids(c.counts, keep))),
        ("freq-id", False, lambda model, _: frequency_only(model, torch.arange(keep))),
        (
            "rows+svd-calib",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "calibration"), tail_rank),
        ),
        (
            "rows+svd-output-calib",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "calibration"), tail_rank, c.covariance),
        ),
        (
            "rows+svd-output-id",
            True,
            lambda model, c: dense_rows_svd_tail(model, torch.arange(exact), tail_rank, c.covariance),
        ),
        (
            "rows+svd-output-mixed",
            True,
            lambda model, c: dense_rows_svd_tail(model, calibrated_rows(c, "mixed"), tail_rank, c.covariance),
        ),
    ]
    if vocab * hidden / ratio >= vocab * train_parameters(hidden, [3, 3]) + hidden * hidden:
        runs.insert(
            3, ("tt-r33-calib", True, tt_arm("calibration", exact_for_ratio(vocab, hidden, ratio, [3, 3]), [3, 3]))
        )
    if ratio == 2:

        def plain(model, _):
            apply_compression(model, CompressionConfig(method="tt", tt_order=3, tt_ranks=[5, 5], tt_solver="eigh"))
            return model.get_input_embeddings().effective_parameters()

        runs.append(("tt-plain", False, plain))
    return runs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF folder of a causal LM (default: SmolLM2-135M from GGUF)")
    parser.add_argument(
        "--corpus",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a folder of JSON documents with a 'text' field (repeat; default: moby_dick, sotu, mail)",
    )
    parser.add_argument(
        "--mail-corpus",
        action="append",
        default=[],
        metavar="NAME",
        help="a --corpus whose texts are raw mail messages: keep their bodies",
    )
    parser.add_argument("--output-dir", required=True)
    parser.add_argument(
        "--ratios",
        type=float,
        nargs="*",
        default=[2.0],
        help="target compression ratios of the parameter-budget arms (none: only --byte-arms)",
    )
    parser.add_argument(
        "--byte-arms",
        nargs="*",
        default=[],
        metavar="NAME",
        help="quantization arms and tiered settings, compared in bytes ('all' for every one): " + ", ".join(BYTE_ARMS),
    )
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    parser.add_argument(
        "--calibration-corpora",
        nargs="+",
        default=None,
        metavar="NAME",
        help="calibrate only on these corpora (default: every corpus); all are still evaluated",
    )
    parser.add_argument("--held-out-fraction", type=float, default=0.25)
    parser.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens scored per corpus")
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=None,
        help="tokens counted per corpus (default: all of its calibration part)",
    )
    parser.add_argument("--covariance-tokens", type=int, default=4096, help="tokens of the hidden-state covariance")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--stride", type=int, default=256)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    accelerator = Accelerator()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or str(smollm2_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dense = accelerator.prepare_model(AutoModelForCausalLM.from_pretrained(model_dir), evaluation_mode=True).eval()
    vocab, hidden = dense.get_input_embeddings().weight.shape

    texts = corpora(args)
    unknown = set(args.calibration_corpora or []) - set(texts)
    if unknown:
        raise ValueError(f"--calibration-corpora {sorted(unknown)} names no corpus (corpora: {sorted(texts)})")
    known = {name for ratio in args.ratios for name, *_ in arms(vocab, hidden, ratio)}
    if set(args.arms or []) - known:
        raise ValueError(f"--arms {sorted(set(args.arms) - known)}: no such arm; choose from {sorted(known)}")
    byte_names = BYTE_ARMS if args.byte_arms == ["all"] else args.byte_arms
    if set(byte_names) - set(BYTE_ARMS):
        raise ValueError(
            f"--byte-arms {sorted(set(byte_names) - set(BYTE_ARMS))}: no such arm; choose from {BYTE_ARMS} or 'all'"
        )
    held_out = {name: token_ids(tokenizer, split[1], args.eval_tokens) for name, split in texts.items()}
    calibrations = {}
    for name, (build, _) in texts.items():
        if args.calibration_corpora and name not in args.calibration_corpora:
            continue
        ids = token_ids(tokenizer, build, args.calibration_tokens)
        counts = torch.bincount(ids, minlength=vocab)[:vocab]
        calibrations[name] = TTCalibration(counts, hidden_covariance(dense, ids[: args.covariance_tokens]))
    base = {name: score(dense, ids, args) for name, ids in held_out.items()}
    accelerator.print("dense ln PPL: " + ", ".join(f"{name} {value:.3f}" for name, value in base.items()))

    dense_bytes = vocab * hidden * 2  # bf16
    jobs = [
        (ratio, name, calibrated, build, "params")
        for ratio in args.ratios
        for name, calibrated, build in arms(vocab, hidden, ratio)
        if not args.arms or name in args.arms
    ]
    jobs += [
        (None, name, calibrated, build, "bytes") for name, calibrated, build in byte_arms(byte_names, vocab, hidden)
    ]
    runs = []
    for ratio, name, calibrated, build, unit in tqdm(jobs, desc="arms", disable=not accelerator.is_main_process):
        for source in calibrations if calibrated else [None]:
            model = copy.deepcopy(dense)
            start = time.perf_counter()
            size = build(model, calibrations[source] if source else None)
            seconds = time.perf_counter() - start
            stored = size * 2 if unit == "params" else size  # parameter arms store bf16 values
            for target, ids in held_out.items():
                delta = score(model, ids, args) - base[target]
                runs.append(
                    {
                        "arm": name,
                        "target_ratio": ratio,
                        "calibration": source,
                        "evaluation": target,
                        "embedding_params": size if unit == "params" else None,
                        "compression_ratio": vocab * hidden / size if unit == "params" else None,
                        "embedding_bytes": stored,
                        "smaller_than_bf16": dense_bytes / stored,
                        "delta_ln_ppl": delta,
                        "compress_seconds": seconds,
                    }
                )
                accelerator.print(
                    f"{name:<24} calib {source or '-':<10} eval {target:<10} "
                    f"{dense_bytes / stored:5.2f}x smaller than bf16  Δ ln PPL {delta:7.3f}"
                )
            del model

    results = {
        "model": model_dir,
        "weights": WEIGHTS_NOTE if args.model is None else model_dir,
        "corpora": {
            name: {
                "calibration_documents": len(split[0]),
                "held_out_documents": len(split[1]),
                "held_out_tokens": len(held_out[name]),
                "dense_ln_ppl": base[name],
            }
            for name, split in texts.items()
        },
        "settings": {
            key: getattr(args, key)
            for key in (
                "held_out_fraction",
                "eval_tokens",
                "calibration_tokens",
                "covariance_tokens",
                "window",
                "stride",
                "ratios",
                "calibration_corpora",
                "arms",
                "byte_arms",
            )
        },
        "runs": runs,
        "wall_seconds": time.perf_counter() - started,
    }
    if accelerator.is_main_process:
        (output / "results.json").write_text(json.dumps(results, indent=2))
        (output / "table.md").write_text(table(results) + "\n" + summary(results) + "\n" + byte_summary(results))
        if args.ratios:
            plot(results, output / "domains.png")
        plot_bytes(results, output / "bytes.png")
        accelerator.print(table(results) + "\n" + summary(results) + "\n" + byte_summary(results))
        accelerator.print(f"wall time {results['wall_seconds']:.0f} s")
    return results


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


if __name__ == "__main__":
    main()
