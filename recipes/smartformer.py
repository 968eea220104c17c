"""Smartformer, the project's main job: CP attention with ranks chosen by reinforcement learning while training.

    accelerate launch recipes/smartformer.py                     # Autoformer on Appliances Energy, horizon 96
    accelerate launch recipes/smartformer.py --model patchtst --horizon 192 --seeds 0 1 2
    accelerate launch recipes/smartformer.py --model patchtst --size medium --seeds 0 1 2   # attention 35 % of the model
    accelerate launch recipes/smartformer.py --dataset my.csv --output-dir out/ --full
    python recipes/smartformer.py --model patchtst --dataset air.csv --timestamp-columns year month day hour \
        --drop-columns No --target pm2.5 --covariates TEMP cbwd --one-hot cbwd
    python recipes/smartformer.py --model patchtst --dataset long.csv --id-column unique_id --target y
    accelerate launch recipes/smartformer.py --model patchtst --model-path my-dense-patchtst/
    accelerate launch recipes/smartformer.py --model patchtst --size medium --budget-ratio 1/16 --seeds 0 1 2

The data flags (``--dataset``, ``--timestamp-column(s)``, ``--id-column``, ``--target``, ``--covariates``,
``--one-hot``, ...) are the library's ``data.arguments``; what was read is printed before training, and a file the
flags do not explain (text columns, calendar fields, duplicated times) stops with one ``error:`` line saying what
to pass. Missing values are masked in the loss and in every metric; covariates are inputs, never scored (PatchTST is
channel-independent, so there they do not influence the targets' forecast, and the recipe prints so).

Compares, with the same data, steps and seed (which also seeds the search's agent, so seeds vary the search too):
the dense model, Smartformer (cp + search; also with the
validation-loss reward), SVD-Smartformer (svd + search), CP at fixed ranks (the paper's Table 8 grid: parameter
ratios 0.1 … 1.0; a subset by default) and, per seed after that seed's Smartformer run, the baselines at its final
attention parameter count: one rank everywhere (``uniform-cp``), random ranks (``random-ranks``, ``--random-draws``
of them) and the searched ranks trained from the start (``searched-ranks``); ``uniform-cp-scheduled`` and
``random-ranks-scheduled`` take the same ranks on the search's schedule: full rank until the step its search ended,
then cut to them at once (the search cuts layer by layer up to that step), so they differ from Smartformer in where
the ranks go, not in how long the model first trained at full rank.
What a user would pick instead, at equal bytes (``quant`` extra): ``ptq-<int8|int4|int2>-<qkv|all>`` round each
seed's trained dense model (torchao weight-only, int8 per row, int4/int2 in groups of 32; no training of their
own), ``qat-ternary-<qkv|all>`` train with ternary weights from the first step (BitNet b1.58 absmean, straight-through).
The library's answer on every Linear: ``svd-all-<ratio>`` (every Linear with both sides >= 32 as ``U Vᵀ`` at that
fraction of its parameters, from the start; ``-scheduled``: at full rank until ``--switch-step``), stored after training
with int8/int4/int2 factors (``+int8`` ..., saved and loaded back), or trained with 4-bit factors (``-q4``). Every
table reports bytes of the q/k/v projections and of every Linear layer, on disk and in RAM (fp32 = 1×), and
``bytes_pareto.png`` plots test MSE against those bytes with the quantization baselines' Pareto front.
With ``--budget-ratio 1/16``: ``smartformer-bytes``, the search over the form of every Linear (``--forms``: dense,
the full weight in a few bits, low-rank or CP factors at a width, a Biprop mask) so that every Linear holds at most
that fraction of its fp32 bytes, each form trained in the precision it is stored in, the model saved and loaded back;
at the bytes each seed's search ended with, ``uniform-<lowbit|svd|biprop>-bytes`` (one form everywhere),
``random-bytes`` and ``greedy-bytes`` (HAQ-style, by each Linear's loss increase on the dense run in each form), and
``searched-bytes`` (the search's own final forms, trained from the first step);
``qat-int4-all`` / ``qat-int2-all``; ``lowbit-<bits>-g<group>``: every Linear as ``method="lowbit"`` (with
``-after-dense-<fraction>``: that share of the steps dense first); ``rows-<bits>-<fraction>``, ``ends-<bits>-<bits>`` and
``vq-<dim>-<bits>`` (two widths inside every Linear; the first and last Linear wider than the ternary rest; the
weights vector-quantized). The naive forecasts
(training mean, last value, the last day and week, or ``--season`` steps) are scored on the same test windows and tabled beside the arms.
Writes ``results.json``, ``results.md`` (a table like the paper's Tables 3–8), the search trace and its plot, and
the Smartformer model (``save_pretrained``: config with compression_config, safetensors, remote code, model card).
Every run is scored on the test windows with the weights of its best validation MSE (checked every few steps;
``--keep-last`` scores the final weights). Autoformer/Informer are trained on the MSE of their forecast mean,
like the original Autoformer (the HF models' default is a Student-t likelihood, whose negative values would break
the paper's loss-ratio reward).
"""

from __future__ import annotations

import argparse
import os
from fractions import Fraction

from accelerate import PartialState

from hf_tensorcompress.cli.script_errors import user_errors
from hf_tensorcompress.data import describe_forecasting, describe_source, forecasting_windows, standardization_of
from hf_tensorcompress.data.arguments import add_forecasting_arguments, load_forecasting_from_args
from hf_tensorcompress.evaluation.naive import evaluate_naive, natural_seasons

from recipekit.byte_flags import add_byte_arguments
from recipekit.forecasters import FAMILIES, FULL, SIZES, Size, build_model, covariate_note
from recipekit.run_headers import RunHeaders
from recipekit.smartformer_arms import build_plan, run_names_help
from recipekit.smartformer_report import save_smartformer, write_results, write_tables
from recipekit.smartformer_seeds import run_seed


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Smartformer: RL-searched CP attention, compared with dense, SVD and fixed ranks.",
        epilog=run_names_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=FAMILIES, default="autoformer")
    parser.add_argument(
        "--model-path",
        default=None,
        help="a dense checkpoint of --model's family to start from (local folder or Hub id)",
    )
    add_forecasting_arguments(parser)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--budget", type=float, default=0.75, help="attention parameter budget of the search (fraction of dense)"
    )
    add_byte_arguments(parser, fraction)
    parser.add_argument(
        "--season",
        type=int,
        nargs="+",
        default=None,
        help="season lengths (steps) of the last-season naive forecasts (default: a day and a week at the data's "
        "frequency, those the context holds: 24 and 168 for hourly data)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="training batch of every run (default by size: 16 for medium)"
    )
    parser.add_argument(
        "--train-stride",
        type=int,
        default=None,
        help="steps between the starts of training windows (default by size: 8 for medium; 1: every window)",
    )
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--patch", type=int, nargs=2, metavar=("LENGTH", "STRIDE"), help="PatchTST's patches (default 16 8)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps of every run, the same for each (default by size: demo 600, medium 200, full 3000)",
    )
    parser.add_argument(
        "--grid", type=float, nargs="*", default=None, help="fixed-rank CP parameter ratios (default by size)"
    )
    parser.add_argument(
        "--runs", nargs="*", default=None, help="only these run names (e.g. dense smartformer; every name: see below)"
    )
    parser.add_argument(
        "--save-steps",
        type=int,
        default=None,
        help="write a checkpoint (with the search state) every N steps of every run",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue every run from the last checkpoint in its folder under --output-dir (written by --save-steps)",
    )
    parser.add_argument(
        "--all-linear-ratios",
        type=float,
        nargs="*",
        default=[0.5, 0.25],
        help="svd-all-<ratio> arms: every Linear as U Vᵀ at this fraction of its parameters, trained at that rank from "
        "the start and (-scheduled) at full rank until --switch-step; their factors are also rounded to int8/int4",
    )
    parser.add_argument(
        "--switch-step",
        type=int,
        default=None,
        help="step the -scheduled svd-all arms are cut at (default: half the steps)",
    )
    parser.add_argument(
        "--random-draws", type=int, default=3, help="random rank assignments per seed (random-ranks arm)"
    )
    parser.add_argument(
        "--validation-batches",
        type=int,
        default=4,
        help="batches of validation windows behind the validation-loss reward (smartformer-validation-reward)",
    )
    parser.add_argument(
        "--distill",
        type=fraction,
        default=None,
        metavar="WEIGHT",
        help="train every arm but dense against this seed's dense run as well as the data: the loss is (1 - WEIGHT) "
        "x MSE to the truth + WEIGHT x MSE to the dense forecast (knowledge distillation; WEIGHT in (0, 1], e.g. 0.5; "
        "needs dense among --runs)",
    )
    parser.add_argument(
        "--keep-last",
        action="store_true",
        help="score the final weights instead of those with the best validation MSE (checked every few steps)",
    )
    parser.add_argument(
        "--weight-average",
        type=decay,
        default=None,
        metavar="DECAY",
        help="judge and keep an exponential moving average of every arm's weights (DECAY per step, e.g. 0.995: about "
        "the last 200 steps; a search run's once its forms are final) instead of the live weights",
    )
    parser.add_argument(
        "--size",
        choices=tuple(SIZES),
        default="demo",
        help="demo: d_model 32, 600 steps (minutes); medium: d_model 128, 8 heads, 2 layers, FFN 256, batch 16, 200 steps, where the "
        "attention projections are a real share of the model; full: the paper's d_model 512, 3000 steps",
    )
    parser.add_argument("--full", action="store_true", help="the paper's size, the same as --size full")
    parser.add_argument("--output-dir", default="smartformer-output")
    args = parser.parse_args(argv)
    if args.reward_baseline == "same_weights" and args.byte_reward != "validation_loss":
        parser.error(
            "--reward-baseline same_weights scores the previous form on held-out batches: add --byte-reward "
            f"validation_loss (got --byte-reward {args.byte_reward})"
        )
    if args.search_epsilon and args.search_epsilon[1] > args.search_epsilon[0]:
        parser.error(
            f"--search-epsilon {' '.join(map(str, args.search_epsilon))}: END (the floor) exceeds START, and ε only "
            "decays; give START >= END"
        )
    return args


def fraction(text: str) -> float:
    """``1/16`` or ``0.0625``: a budget fraction in (0, 1]."""
    try:
        value = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction like 1/16 or 0.0625") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def decay(text: str) -> float:
    """A moving average's decay per step, in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number like 0.995") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: a decay in (0, 1), e.g. 0.995 (about the last 200 steps)")
    return value


def seasons_of(train, timestamp_column: str | None, context: int) -> list[int]:
    """A day and a week in steps of the training split's timestamps, those ``--context`` holds (none without them)."""
    if timestamp_column is None:
        return []
    return natural_seasons(train.with_format(None)[timestamp_column], context)


def main(argv=None) -> dict:
    args = parse_args(argv)
    size = FULL if args.full else SIZES[args.size]
    with user_errors("smartformer.py"):
        for flag in ("random_draws", "validation_batches", "save_steps", "batch_size", "train_stride"):
            value = getattr(args, flag)
            if value is not None and value < 1:
                raise ValueError(f"--{flag.replace('_', '-')} {value} must be >= 1")
        for season in args.season or []:
            if season < 1:
                raise ValueError(f"--season {season} must be >= 1 (steps of the season a naive forecast repeats)")
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps {args.steps} must be >= 1")
        size = Size(
            **{
                **size.__dict__,
                "steps": args.steps or size.steps,
                "grid": tuple(args.grid if args.grid is not None else size.grid),
                "batch_size": args.batch_size or size.batch_size,
                "train_stride": args.train_stride or size.train_stride,
                **dict(zip(("patch_length", "patch_stride"), args.patch or (size.patch_length, size.patch_stride))),
                **dict(zip(("interval", "consecutive_actions", "max_actions_per_layer"), args.search_schedule or ())),
            }
        )
        dataset = load_forecasting_from_args(args)
        stats = standardization_of(dataset["train"])
        args.channels = len(stats.columns)
        if PartialState().is_main_process:
            print(describe_forecasting(dataset, describe_source(args.dataset)))
            note = covariate_note(args.model, [c for c in stats.columns if c not in stats.target_columns])
            if note:
                print(note)
        shape_model = build_model(args.model, args.channels, args.context, args.horizon, size, 0, args.model_path)
        data = (
            forecasting_windows(dataset["train"], shape_model.config, stride=size.train_stride, future_mask=True),
            forecasting_windows(dataset["validation"], shape_model.config, stride=size.eval_stride),
            forecasting_windows(dataset["test"], shape_model.config, stride=size.eval_stride),
        )
        seasons = args.season or seasons_of(dataset["train"], stats.timestamp_column, args.context)
        if PartialState().is_main_process:
            print(
                f"naive forecasts: training mean, last value, last season of {seasons} steps"
                if seasons
                else f"naive forecasts: training mean, last value (no seasonal one: no day or week of the data's "
                f"time steps fits the {args.context}-step context, or it has no evenly spaced timestamps; pass "
                "--season N to score one)"
            )
    with user_errors("smartformer.py"):
        plan = build_plan(size, args, shape_model)
    results = {
        "model": args.model,
        "dataset": args.dataset or "appliances_energy",
        "horizon": args.horizon,
        "steps": size.steps,
        "batch_size": size.batch_size,
        "train_stride": size.train_stride,
        "validate_every": size.validate_every,
        "keep_last": args.keep_last,
        "weight_average": args.weight_average,
        "learning_rate": args.learning_rate,
        "budget_ratio": args.budget_ratio,
        "naive": evaluate_naive(data[2], seasons, batch_size=size.batch_size),
        "seasons": seasons,
        "runs": [],
    }
    os.makedirs(args.output_dir, exist_ok=True)
    headers = RunHeaders(
        len(args.seeds)
        * sum(args.random_draws if a[0].startswith(("random-ranks", "random-bytes")) else 1 for a in plan.arms)
    )
    states = [run_seed(seed, plan, args, size, data, results, headers) for seed in args.seeds]
    if states[-1].trainer.is_world_process_zero():
        report(results, args, states[0].smart)
    # every rank closes its process group here rather than in the group's destructor at exit, which can abort a
    # rank ("terminate called without an active exception") and fail a launch whose work was done
    processes = PartialState()
    processes.wait_for_everyone()
    processes.destroy_process_group()
    return results


def report(results: dict, args: argparse.Namespace, smart: tuple | None) -> None:
    """Write the results, the tables and the searched model (main process only)."""
    write_results(results, args.output_dir)
    table = write_tables(results, args.output_dir, len(args.seeds))
    if smart is not None:  # --runs without smartformer: nothing searched, no model to save
        smart_model, smart_dir = smart
        for file in ("smartformer_trace.json", "smartformer_trace.png"):
            if os.path.exists(os.path.join(smart_dir, file)):
                os.replace(os.path.join(smart_dir, file), os.path.join(args.output_dir, file))
        save_smartformer(smart_model, results, os.path.join(args.output_dir, "smartformer-model"))
    print(table)


if __name__ == "__main__":
    main()
