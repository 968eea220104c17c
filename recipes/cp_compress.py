"""Main job: train a small PatchTST, compress its attention (CP or SVD), fine-tune, evaluate, save.

    accelerate launch recipes/cp_compress.py            # or: python recipes/cp_compress.py
    python recipes/cp_compress.py --dataset my.csv --timestamp-column when --horizon 24 --output-dir outputs/mine
    python recipes/cp_compress.py --dataset long.csv --id-column unique_id --target y --horizon 24

Defaults: the Appliances Energy data (7:1:2 chronological split, standardised with training statistics), horizon
96 (the paper's shortest), test MSE/MAE on standardised values, every ``--eval-stride``-th test window. Writes the
compressed checkpoint (loads with ``trust_remote_code=True``, no hf_tensorcompress needed), ``standardization.json``
(to un-scale forecasts) and ``results.json`` into ``--output-dir``, and prints a markdown table.

Data flags are the library's (``--timestamp-column(s)``, ``--id-column``, ``--target``, ``--covariates``,
``--one-hot``, ...); what was read is printed first; a user mistake ends with one ``error:`` line (exit 2).
Missing values are masked in the loss and the metrics.

Runs: the dense model; the dense model trained ``--finetune-steps`` more (a fair baseline: the compressed model
gets those steps too); the compressed model before and after fine-tuning. Each training phase keeps the weights of
its best validation MSE (checked every ``--validate-every`` steps); ``results.md`` lists each run's total steps. ``train_seconds`` is the wall time of
each run's own training phase; ``attention_params`` counts the q/k/v projections that get compressed.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import (
    AutoConfig,
    PatchTSTConfig,
    PatchTSTForPrediction,
    PreTrainedModel,
    TrainingArguments,
    set_seed,
)

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report
from hf_tensorcompress.cli.script_errors import user_errors
from hf_tensorcompress.data import describe_forecasting, describe_source, forecasting_windows, standardization_of
from hf_tensorcompress.data.arguments import add_forecasting_arguments, load_forecasting_from_args
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.evaluation.tables import runs_table
from hf_tensorcompress.runtime.atomic import atomic_folder
from hf_tensorcompress.training.forecasting import BestValidation, ForecastTrainer

from recipekit.forecasters import CLASSES


def rank_value(text: str) -> int | float:
    """``"8"`` is rank 8, ``"0.5"`` or ``"1.0"`` a parameter fraction, as ``CompressionConfig.rank`` reads them."""
    return float(text) if any(c in text for c in ".eE") else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        help="folder of a pretrained PatchTST/Autoformer/Informer ForPrediction checkpoint "
        "(default: a small PatchTST trained here)",
    )
    add_forecasting_arguments(parser)
    # model shape of the fresh PatchTST (a --model checkpoint brings its own)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--context-length", type=int, default=336)
    parser.add_argument("--patch-length", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--method", choices=("cp", "svd"), default="cp")
    parser.add_argument(
        "--rank",
        type=rank_value,
        default=0.5,
        help="an int rank (e.g. 8), or a fraction in (0, 1] of the dense parameters (e.g. 0.5)",
    )
    parser.add_argument("--max-steps", type=int, default=100, help="training steps of the dense model (0: none)")
    parser.add_argument("--finetune-steps", type=int, default=50, help="training steps after compression")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--train-stride", type=int, default=8, help="step between training windows")
    parser.add_argument("--eval-stride", type=int, default=2, help="step between test windows (1: all)")
    parser.add_argument(
        "--validate-every", type=int, default=25, help="steps between validation checks (model selection)"
    )
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="outputs/cp_compress")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, channels: int) -> PreTrainedModel:
    """The pretrained checkpoint given by ``--model``, or a fresh small PatchTST sized from the flags."""
    if args.model:
        config = AutoConfig.from_pretrained(args.model)
        if config.model_type not in CLASSES:
            raise ValueError(f"--model {args.model} is a {config.model_type!r} model; use one of {sorted(CLASSES)}")
        return CLASSES[config.model_type].from_pretrained(args.model)
    config = PatchTSTConfig(
        num_input_channels=channels,
        context_length=args.context_length,
        prediction_length=args.horizon,
        patch_length=args.patch_length,
        patch_stride=args.patch_length,
        d_model=args.d_model,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        ffn_dim=2 * args.d_model,
        dropout=0.1,
        head_dropout=0.1,
        loss="mse",
        scaling="std",
    )
    return PatchTSTForPrediction(config)


def train(model: PreTrainedModel, windows, validation, steps: int, args: argparse.Namespace) -> float:
    """``steps`` Trainer steps on ``windows``, keeping the weights of the best validation MSE; returns the seconds
    it took (0 when there is nothing to do)."""
    if steps <= 0:
        return 0.0
    with tempfile.TemporaryDirectory() as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            max_steps=steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=steps // 10,
            logging_steps=max(1, steps // 10),
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            dataloader_num_workers=0,
            dataloader_pin_memory=torch.cuda.is_available(),
        )
        trainer = ForecastTrainer(model=model, args=training_args, train_dataset=windows)
        trainer.add_callback(BestValidation(trainer, validation, args.validate_every, args.eval_batch_size))
        start = time.perf_counter()
        trainer.train()
        return time.perf_counter() - start


def run_entry(
    name: str, model: PreTrainedModel, metrics: dict, attention_params: int, seconds: float, steps: int
) -> dict:
    params = sum(p.numel() for p in model.parameters())
    return {
        "name": name,
        "metrics": metrics,
        "params": params,
        "attention_params": attention_params,
        "steps": steps,
        "train_seconds": round(seconds, 1),
    }


def markdown_table(runs: list[dict]) -> str:
    return runs_table(
        runs,
        {"mse": "MSE", "mae": "MAE"},
        {"params": "params", "attention_params": "q/k/v params", "steps": "steps", "train_seconds": "train s"},
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    set_seed(args.seed)
    state = PartialState()
    output_dir = Path(args.output_dir)
    with user_errors("cp_compress.py"):
        data = load_forecasting_from_args(args)
        stats = standardization_of(data)
        model = build_model(args, channels=len(stats.columns))
        if state.is_main_process:  # with the model's family: a PatchTST ignores covariates, and the summary says so
            print(describe_forecasting(data, describe_source(args.dataset), model.config.model_type))
        train_windows = forecasting_windows(data["train"], model.config, stride=args.train_stride, future_mask=True)
        validation_windows = forecasting_windows(data["validation"], model.config, stride=args.eval_stride)
        test_windows = forecasting_windows(data["test"], model.config, stride=args.eval_stride)
    print(
        f"data: {len(stats.columns)} channels; {len(train_windows)} training windows, {len(test_windows)} test windows"
    )

    def score(candidate: PreTrainedModel, description: str) -> dict | None:
        """Test MSE/MAE, computed once, on the main process."""
        if not state.is_main_process:
            return None
        return evaluate_forecaster(candidate, test_windows, batch_size=args.eval_batch_size, description=description)

    dense_seconds = train(model, train_windows, validation_windows, args.max_steps, args)
    control = copy.deepcopy(model)  # the dense model trained as long as the compressed one: a fair baseline
    compressed = apply_compression(copy.deepcopy(model), CompressionConfig(method=args.method, rank=args.rank))
    qkv = compression_report(compressed)["targets"]
    label = f"{args.method} rank={args.rank}"
    runs = [
        ("dense", model, score(model, "dense"), qkv["dense_params"], dense_seconds, args.max_steps),
        (f"{label}, no fine-tune", compressed, score(compressed, label), qkv["params"], 0.0, args.max_steps),
    ]
    if args.finetune_steps > 0:
        total = args.max_steps + args.finetune_steps
        control_seconds = train(control, train_windows, validation_windows, args.finetune_steps, args)
        tuned_seconds = train(compressed, train_windows, validation_windows, args.finetune_steps, args)
        runs.insert(
            1,
            (
                f"dense, +{args.finetune_steps} steps",
                control,
                score(control, "dense, more steps"),
                qkv["dense_params"],
                control_seconds,
                total,
            ),
        )
        runs.append(
            (
                f"{label}, fine-tuned",
                compressed,
                score(compressed, f"{label}, fine-tuned"),
                qkv["params"],
                tuned_seconds,
                total,
            )
        )
    results = {}
    if state.is_main_process:
        with atomic_folder(output_dir) as staging:  # model, statistics and results replace the folder together
            compressed.save_pretrained(staging)
            (staging / "standardization.json").write_text(stats.to_json())
            results = {
                "model": args.model or "PatchTSTForPrediction (small, trained here)",
                "dataset": args.dataset or "appliances_energy",
                "horizon": model.config.prediction_length,
                "context_length": model.config.context_length,
                "method": args.method,
                "rank": args.rank,
                "eval_stride": args.eval_stride,
                "runs": [run_entry(*run) for run in runs],
            }
            (staging / "results.json").write_text(json.dumps(results, indent=2))
            table = markdown_table(results["runs"])
            note = (
                f"\nSteps: the dense model {args.max_steps}; then {args.finetune_steps} more for the dense control and for "
                f"the compressed model alike (each phase keeps its best validation MSE, checked every "
                f"{args.validate_every} steps).\n"
            )
            (staging / "results.md").write_text(
                f"### {results['model']} on {results['dataset']}, horizon {results['horizon']}\n\n{table}{note}"
            )
        print(table + note)
        print(f"saved the compressed model and results.json to {output_dir}")
    state.wait_for_everyone()
    state.destroy_process_group()  # now, not in the group's destructor at exit (which can abort a rank)
    return results


if __name__ == "__main__":
    main()
