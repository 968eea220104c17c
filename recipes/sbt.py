"""Sparse Binary Transformers (Gorbett et al., KDD '23) on real data: dense vs biprop, side by side.

    accelerate launch recipes/sbt.py --task classification --output-dir out/sbt-cls
    accelerate launch recipes/sbt.py --task classification --dataset my_series.csv --id-column series --output-dir out/mine
    accelerate launch recipes/sbt.py --task forecasting   --output-dir out/sbt-fc
    accelerate launch recipes/sbt.py --task anomaly       --output-dir out/sbt-ad

* classification: ``--dataset`` is a UEA name (default JapaneseVowels, from aeon), a ``.ts``/``.arff`` file, a
  CSV/Parquet table (long with ``--id-column``, else wide: one row per series) or a ``datasets`` folder; ragged
  series are padded with ``past_observed_mask``. ``PatchTSTForClassification`` with patch length 1 (one token per
  time step, as the paper's encoder); biprop on every encoder Linear plus the fixed random Q/K/V masks.
* forecasting: single-step, Appliances Energy by default or any table read with the forecasting data flags
  (``--timestamp-column(s)``, ``--target``, ...); Step-T attention, the input at step t zeroed and the loss on step t.
* anomaly: KDD-TSAD_135 (aeon) or a CSV with a ``label`` column; x_t predicted from the steps before it, score =
  squared error at step t; thresholds by a validation quantile and by POT, F1 with the point-adjust rule.

Against quantization (``quant`` extra): ``ptq-<int8|int4|int2>-<qkv|all>`` round each seed's trained dense model
(torchao weight-only; ``--ptq-schemes``), ``qat-ternary-<qkv|all>`` train ternary weights from the first step
(``--qat-scopes``); every run reports the bytes of every Linear layer on disk and in RAM, and ``bytes_pareto.png``
plots the test metric against them.

Budget: every arm (dense and each keep ratio × weight seed) trains for the same ``--steps`` optimizer steps and is
scored with the weights of its best validation check (every ``--validate-every`` steps): the budget does not depend
on the dataset size, so a small dataset is not under-trained. Learning rates: weights ``--learning-rate`` (dense
and biprop alike; tuned for dense on JapaneseVowels' validation split), biprop scores ``--score-learning-rate``
(25x larger: scores are only ranked, their scale is arbitrary). All of the data reading, training, metrics and the
table are library calls; this script parses flags and writes results.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from hf_tensorcompress.baselines import quantization
from hf_tensorcompress.cli.script_errors import user_errors
from hf_tensorcompress.data.arguments import add_classification_arguments, add_forecasting_arguments
from hf_tensorcompress.evaluation.sequences import forecast_scores
from hf_tensorcompress.runtime.atomic import atomic_folder
from hf_tensorcompress.training import StepBudget, train_for_steps

from recipekit.costs import scope_names
from recipekit.quantization_arms import ternary
from recipekit.sbt_report import measure, write_results
from recipekit.sbt_tasks import TASK_DEFAULTS, build_model, compress, load_data, objective

PROG = "sbt.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASK_DEFAULTS), required=True)
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", required=True)
    add_forecasting_arguments(parser)
    add_classification_arguments(parser, with_forecasting=True)
    parser.add_argument(
        "--model-path",
        "--model_path",
        dest="model_path",
        default=None,
        help="start from this PatchTST checkpoint instead of a fresh one",
    )
    parser.add_argument(
        "--keep-ratios",
        "--keep_ratios",
        dest="keep_ratios",
        type=float,
        nargs="*",
        default=[0.75, 0.5, 0.25],
        help="biprop keep ratios (none: dense only)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--ptq-schemes",
        nargs="*",
        default=list(quantization.SCHEMES),
        choices=list(quantization.SCHEMES),
        help="post-training weight-only quantization of each seed's dense run (q/k/v, then every Linear)",
    )
    parser.add_argument(
        "--qat-scopes",
        nargs="*",
        default=["qkv", "all"],
        choices=["qkv", "all"],
        help="ternary quantization-aware training arms (q/k/v or every Linear), same steps as dense",
    )
    parser.add_argument(
        "--target-modules",
        "--target_modules",
        dest="target_modules",
        default="all-linear",
        help="'all-linear' (paper) or a regex / None",
    )
    parser.add_argument(
        "--no-attention-option",
        "--no_attention_option",
        dest="no_attention_option",
        action="store_true",
        help="biprop without Q/K/V masks / Step-T",
    )
    parser.add_argument("--window", type=int, default=50, help="forecasting/anomaly window w")
    parser.add_argument("--stride", type=int, default=10, help="forecasting: stride between windows")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--norm-type",
        "--norm_type",
        dest="norm_type",
        choices=["batchnorm", "layernorm"],
        default="batchnorm",
        help="batchnorm for every task: with one value per token (patch length 1), LayerNorm over d_model erases "
        "the value's magnitude (the paper's LayerNorm for forecasting saw all m features in one token)",
    )
    budget = parser.add_argument_group("budget (the same for every arm)")
    budget.add_argument(
        "--steps",
        "--max_steps",
        dest="steps",
        type=int,
        default=None,
        help="optimizer steps of every arm (default by task: "
        + ", ".join(f"{t} {d['steps']}" for t, d in TASK_DEFAULTS.items())
        + ")",
    )
    budget.add_argument(
        "--validate-every", type=int, default=None, help="steps between validation checks (model selection)"
    )
    budget.add_argument(
        "--learning-rate", "--lr", dest="learning_rate", type=float, default=None, help="weights (dense and biprop)"
    )
    budget.add_argument(
        "--score-learning-rate",
        "--score_lr",
        dest="score_learning_rate",
        type=float,
        default=None,
        help="biprop scores",
    )
    for flag, kind in (("batch-size", int), ("d-model", int), ("heads", int), ("ffn-dim", int), ("dropout", float)):
        name = flag.replace("-", "_")
        budget.add_argument(f"--{flag}", f"--{name}", dest=name, type=kind, default=None)
    budget.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument(
        "--reconstruct-current",
        dest="zero_current",
        action="store_false",
        help="anomaly: feed x_t to the model (reconstruct it) instead of zeroing it",
    )
    parser.add_argument("--no-instance-norm", action="store_true", help="forecasting/anomaly: no per-window scaling")
    parser.add_argument("--manual-tau", type=float, default=0.01, help="anomaly: flag the top tau of validation scores")
    parser.add_argument("--pot-risk", type=float, default=1e-3)
    parser.add_argument("--pot-level", type=float, default=0.98)
    args = parser.parse_args(argv)
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.target_modules in ("None", "none", ""):
        args.target_modules = None
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    accelerator = Accelerator()
    with user_errors(PROG):
        budget = StepBudget(
            args.steps,
            args.batch_size,
            args.learning_rate,
            args.score_learning_rate,
            args.validate_every,
            args.weight_decay,
        )
        splits, classes, summary, extra = load_data(args)
    accelerator.print(summary)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    loss, select, test = objective(args)
    steps, channels = splits["train"].with_format("numpy")[0]["past_values"].shape
    sample = {"past_values": splits["test"].with_format("torch")[:1]["past_values"]}
    dataset = summary.splitlines()[0].removeprefix("data: ")
    results = {"task": args.task, "dataset": dataset, "args": vars(args), "runs": []}
    if args.task == "forecasting":  # context for the MSE/MAE figures: predict x_t = x_{t-1}
        values = splits["test"].with_format("numpy")[:]["past_values"]
        results["persistence_baseline"] = forecast_scores(values[:, -2], values[:, -1])
    dense = {}  # seed -> (trained dense model, its outcome): what the post-training quantization arms round
    arms = [(None, None), *((ratio, None) for ratio in args.keep_ratios), *((None, scope) for scope in args.qat_scopes)]
    for keep_ratio, qat in arms:
        for seed in args.seeds:
            name = f"qat-ternary-{qat}" if qat else "dense" if keep_ratio is None else f"biprop-{keep_ratio}"
            torch.manual_seed(seed)
            np.random.seed(seed)
            model = compress(build_model(args.task, channels, steps, classes, args), args.task, keep_ratio, seed, args)
            packed = ternary(model, qat) if qat else None
            outcome = train_for_steps(
                model,
                splits["train"].with_format("torch"),
                loss,
                budget,
                select(splits["validation"]),
                accelerator,
                f"{name} seed {seed}",
            )
            model = accelerator.unwrap_model(model).cpu()
            metrics = test(model, splits, extra)
            checkpoint = None if qat else out / "checkpoints" / f"{name}-seed{seed}"
            if checkpoint is not None and accelerator.is_main_process:
                with atomic_folder(checkpoint) as staging:  # a dense run too: all files or the old folder
                    model.save_pretrained(staging)
            run = measure(model, name, keep_ratio, seed, metrics, outcome, sample, checkpoint, packed)
            results["runs"].append(run)
            accelerator.print(
                json.dumps({k: run[k] for k in ("name", "seed", "metrics", "selected_step", "linear_bytes")})
            )
            if name == "dense":
                dense[seed] = (model, outcome)
    for scope in ("qkv", "all"):
        for scheme in args.ptq_schemes:
            for seed in args.seeds:  # round each seed's trained dense model: no training, the same test windows
                model = quantization.quantize_linears(
                    copy.deepcopy(dense[seed][0]).eval(), scope_names(dense[seed][0], scope), scheme
                )
                outcome = dataclasses.replace(dense[seed][1], seconds=0.0)
                run = measure(
                    model, f"ptq-{scheme}-{scope}", None, seed, test(model, splits, extra), outcome, sample, None
                )
                results["runs"].append(run)
                accelerator.print(json.dumps({k: run[k] for k in ("name", "seed", "metrics", "linear_bytes")}))
    if accelerator.is_main_process:
        accelerator.print(write_results(results, out, args))
    accelerator.wait_for_everyone()
    accelerator.end_training()  # closes the process group now, not in its destructor at exit (which can abort a rank)
    return results


if __name__ == "__main__":
    main()
