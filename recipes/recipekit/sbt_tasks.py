"""The SBT recipe's three tasks: their default budgets, data, models (dense or biprop) and objectives."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PatchTSTConfig, PatchTSTForClassification, PatchTSTForPretraining

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.data import describe_source, standardization_of
from hf_tensorcompress.data.anomaly import load_anomaly_series
from hf_tensorcompress.data.arguments import load_classification_from_args, load_forecasting_from_args
from hf_tensorcompress.data.classification import describe_classification
from hf_tensorcompress.data.step_windows import split_values, step_windows
from hf_tensorcompress.data.summary import describe_forecasting
from hf_tensorcompress.evaluation.anomaly import threshold_scores
from hf_tensorcompress.evaluation.sequences import (
    anomaly_scores,
    classification_scores,
    classification_selection,
    forecast_scores,
    step_t_errors,
)
from hf_tensorcompress.methods.biprop.apply import apply_attention
from hf_tensorcompress.training.step_t import step_t_loss

#: The budget and model flags each task defaults to (a flag given on the command line wins).
DEFAULT_FLAGS = (
    "steps",
    "learning_rate",
    "score_learning_rate",
    "batch_size",
    "d_model",
    "heads",
    "ffn_dim",
    "dropout",
    "validate_every",
)
TASK_DEFAULTS = {
    task: dict(zip(DEFAULT_FLAGS, values))
    for task, values in {
        "classification": (800, 5e-3, 0.05, 32, 32, 2, 64, 0.1, 50),
        "forecasting": (200, 1e-3, 0.05, 64, 32, 2, 64, 0.0, 50),
        "anomaly": (250, 1e-3, 0.05, 32, 16, 2, 32, 0.0, 50),
    }.items()
}


def load_data(args) -> tuple[dict, int, str, dict]:
    """(splits as datasets, number of classes, description of the source, extras such as the test labels)."""
    if args.task == "classification":
        args.dataset = args.dataset or "JapaneseVowels"
        data = load_classification_from_args(args)
        return (
            dict(data),
            data["train"].features["target_values"].num_classes,
            describe_classification(data, args.dataset),
            {},
        )
    if args.task == "forecasting":
        data = load_forecasting_from_args(args)
        columns = list(standardization_of(data).columns)
        splits = {name: step_windows(split_values(data[name], columns), args.window, args.stride) for name in data}
        return splits, 0, describe_forecasting(data, describe_source(args.dataset)), {}
    fit, val, test, labels = load_anomaly_series(args.dataset, args.window, args.validation)
    splits = {
        "train": step_windows(fit, args.window),
        "validation": step_windows(val, args.window),
        "test": step_windows(test, args.window, labels=labels),
    }
    source = args.dataset or "KDD-TSAD_135 (aeon)"
    summary = f"data: {source}\n  windows: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    return splits, 0, summary, {"labels": np.asarray(splits["test"]["target_values"])}


def build_model(task: str, channels: int, steps: int, classes: int, args) -> torch.nn.Module:
    common = dict(
        num_input_channels=channels,
        context_length=steps,
        patch_length=1,
        patch_stride=1,
        d_model=args.d_model,
        num_attention_heads=args.heads,
        num_hidden_layers=args.layers,
        ffn_dim=args.ffn_dim,
        scaling=None,
        dropout=args.dropout,
        head_dropout=args.dropout,
        attention_dropout=0.0,
        ff_dropout=0.0,
        positional_dropout=0.0,
        path_dropout=0.0,
        norm_type=args.norm_type,
    )
    if args.model_path:
        cls = PatchTSTForClassification if task == "classification" else PatchTSTForPretraining
        return cls.from_pretrained(args.model_path)
    if task == "classification":
        return PatchTSTForClassification(PatchTSTConfig(num_targets=classes, pooling_type="mean", **common))
    return PatchTSTForPretraining(PatchTSTConfig(do_mask_input=False, **common))


def compress(model, task: str, keep_ratio: float | None, seed: int, args):
    """Dense baseline (``keep_ratio=None``) or biprop; forecasting/anomaly use Step-T attention in both."""
    attention = "qkv_mask" if task == "classification" else "step_t"
    if keep_ratio is None:
        if attention == "step_t":
            apply_attention(model, "step_t")
        return model
    config = CompressionConfig(
        method="biprop",
        target_modules=args.target_modules,
        keep_ratio=keep_ratio,
        weight_seed=seed,
        attention=None if args.no_attention_option else attention,
    )
    return apply_compression(model, config)


def objective(args):
    """(training loss, validation criterion (higher is better), test metrics) of the task."""
    zero = args.task == "forecasting" or args.zero_current
    norm = not args.no_instance_norm
    if args.task == "classification":
        return (
            (lambda model, batch: model(**batch).loss),
            classification_selection,
            (
                lambda model, splits, extra: {
                    "val_accuracy": classification_scores(model, splits["validation"])["accuracy"],
                    "accuracy": classification_scores(model, splits["test"])["accuracy"],
                }
            ),
        )

    def select(split):
        return lambda model: (-forecast_scores(*step_t_errors(model, split, zero, norm))["mse"],)

    def test(model, splits, extra):
        if args.task == "forecasting":
            return forecast_scores(*step_t_errors(model, splits["test"], zero, norm))
        return threshold_scores(
            anomaly_scores(*step_t_errors(model, splits["validation"], zero, norm)),
            anomaly_scores(*step_t_errors(model, splits["test"], zero, norm)),
            extra["labels"],
            args.manual_tau,
            args.pot_risk,
            args.pot_level,
        )

    return (lambda model, batch: step_t_loss(model, batch, zero, norm)), select, test
