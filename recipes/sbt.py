"""Sparse Binary Transformers (Gorbett et al., KDD '23) on real data: dense vs biprop, side by side.

    accelerate launch recipes/sbt.py --task classification --output_dir out/sbt-cls
    accelerate launch recipes/sbt.py --task forecasting   --output_dir out/sbt-fc
    accelerate launch recipes/sbt.py --task anomaly       --output_dir out/sbt-ad

* classification: UEA JapaneseVowels (aeon; ragged lengths padded to 29 with ``past_observed_mask``),
  ``PatchTSTForClassification`` with patch length 1 (one token per time step, as the paper's encoder), biprop on
  every encoder Linear plus the fixed random Q/K/V masks. ``--dataset`` takes another aeon/UEA name.
* forecasting: single-step, Appliances Energy (26 real channels; ``--data`` takes any CSV), Step-T attention,
  the input at step t zeroed and the loss on step t only; ``PatchTSTForPretraining`` (its per-patch head
  reconstructs every step; we read step t).
* anomaly: KDD-TSAD_135 (aeon; ``--data`` takes a CSV with a ``label`` column), same model, Step-T attention,
  x_t reconstructed "given previous time points" (zeroed in the input, as for forecasting; otherwise the residual
  stream hands x_t to the output), score = squared error at step t; threshold by a validation quantile and by POT (generalised Pareto), F1 with the
  point-adjust rule.

Every run (dense baseline and each keep ratio × weight seed) trains with the same architecture and budget, is saved
with ``save_pretrained`` (bits-only for biprop) and measured: metrics, parameters, storage bits, non-zero FLOPs,
checkpoint bytes, train seconds. Hyper-parameters of the defaults were chosen on the validation split only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from accelerate import Accelerator
from scipy.stats import genpareto
from tqdm.auto import tqdm
from transformers import PatchTSTConfig, PatchTSTForClassification, PatchTSTForPretraining

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.methods.biprop.apply import apply_attention
from hf_tensorcompress.core.metrics import nonzero_flops, storage_bits
from hf_tensorcompress.extras import require


# ---------------------------------------------------------------------- data
@dataclass
class Split:
    values: np.ndarray  # (n, steps, channels) float32, standardised with training statistics
    observed: np.ndarray  # same shape, 1 where a value exists (padding is 0)
    targets: np.ndarray  # class ids (classification) or per-window labels (anomaly); unused for forecasting


def standardise(train: np.ndarray, observed: np.ndarray, *others: np.ndarray) -> tuple:
    """Zero mean, unit variance per channel from the observed training values (paper §4)."""
    count = observed.sum(axis=(0, 1))
    mean = (train * observed).sum(axis=(0, 1)) / count
    std = np.sqrt((((train - mean) * observed) ** 2).sum(axis=(0, 1)) / count) + 1e-8
    return tuple(((x - mean) / std).astype(np.float32) for x in (train, *others))


def load_classification(name: str, length: int | None, validation: float, seed: int) -> tuple[Split, Split, Split, int]:
    """A UEA dataset from aeon, padded (at the end) to a common length; a stratified validation split of train."""
    aeon_load = require("aeon.datasets", "the UEA classification data").load_classification

    raw = {split: aeon_load(name, split=split) for split in ("train", "test")}
    steps = length or max(s.shape[1] for series, _ in raw.values() for s in series)

    def padded(split: str):
        series, labels = raw[split]
        values = np.zeros((len(series), steps, series[0].shape[0]), np.float32)
        observed = np.zeros_like(values)
        for i, s in enumerate(series):
            values[i, : s.shape[1]], observed[i, : s.shape[1]] = s.T[:steps], 1.0
        return values, observed, labels

    train_x, train_o, train_labels = padded("train")
    test_x, test_o, test_labels = padded("test")
    classes = sorted(set(train_labels))
    train_y = np.array([classes.index(v) for v in train_labels])
    test_y = np.array([classes.index(v) for v in test_labels])
    rng = np.random.default_rng(seed)
    val_idx = np.concatenate(
        [rng.permutation(np.flatnonzero(train_y == c))[: max(1, round(validation * (train_y == c).sum()))] for c in range(len(classes))]
    )
    fit_idx = np.setdiff1d(np.arange(len(train_y)), val_idx)
    fit_x, test_xs, val_xs = standardise(train_x[fit_idx], train_o[fit_idx], test_x, train_x[val_idx])
    mask = lambda x, o: x * o  # noqa: E731  (padding stays exactly 0 after standardising)
    return (
        Split(mask(fit_x, train_o[fit_idx]), train_o[fit_idx], train_y[fit_idx]),
        Split(mask(val_xs, train_o[val_idx]), train_o[val_idx], train_y[val_idx]),
        Split(mask(test_xs, test_o), test_o, test_y),
        len(classes),
    )


def windows(series: np.ndarray, labels: np.ndarray | None, window: int, stride: int = 1) -> Split:
    """Overlapping windows ``[x_{t-w+1}, …, x_t]``; the label of a window is the label of its step t."""
    starts = np.arange(0, len(series) - window + 1, stride)
    values = np.stack([series[s : s + window] for s in starts]).astype(np.float32)
    targets = labels[starts + window - 1] if labels is not None else np.zeros(len(starts))
    return Split(values, np.ones_like(values), targets)


def load_forecasting(path: str | None, window: int, stride: int, limit: int | None) -> tuple[Split, Split, Split, int]:
    """Appliances Energy (or any numeric CSV), 70/10/20 chronological split, standardised on train."""
    if path is None:
        from hf_tensorcompress.assets import appliances_energy_csv

        path = str(appliances_energy_csv())
    frame = pd.read_csv(path)
    frame = frame.drop(columns=[c for c in ("rv1", "rv2") if c in frame.columns])  # noise columns, on purpose
    data = frame.select_dtypes("number").to_numpy(np.float32)
    data = data[:limit] if limit else data
    n = len(data)
    cuts = [0, int(0.7 * n), int(0.8 * n), n]
    parts = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    parts = standardise(parts[0][None], np.ones_like(parts[0][None]), parts[1][None], parts[2][None])
    return (*(windows(p[0], None, window, stride) for p in parts), data.shape[1])


def load_anomaly(path: str | None, window: int, validation: float) -> tuple[Split, Split, Split, int]:
    """KDD-TSAD_135 from aeon (benign train series, labelled test series) or a CSV with a ``label`` column.

    Train on the first ``1 - validation`` of the benign part; the rest is the validation set the thresholds come
    from; the test windows are the labelled part after the training series. For a CSV the benign part is the first
    half of the stretch before the first labelled anomaly (a third of the series if it starts with one).
    """
    if path is None:
        load_kdd_tsad_135 = require("aeon.datasets", "the KDD-TSAD anomaly data").load_kdd_tsad_135

        benign, _ = load_kdd_tsad_135(split="train")
        series, labels = load_kdd_tsad_135(split="test")
        test_series, test_labels = series[len(benign) - window + 1 :], labels[len(benign) - window + 1 :]
    else:
        frame = pd.read_csv(path)
        labels_all = frame.pop("label").to_numpy()
        values_all = frame.select_dtypes("number").to_numpy(np.float32)
        benign_end = int(np.argmax(labels_all > 0) * 0.5) or len(values_all) // 3
        benign, test_series, test_labels = values_all[:benign_end], values_all[benign_end:], labels_all[benign_end:]
    benign = benign.reshape(len(benign), -1).astype(np.float32)
    test_series = test_series.reshape(len(test_series), -1).astype(np.float32)
    cut = int((1 - validation) * len(benign))
    fit, val, test = standardise(benign[:cut][None], np.ones_like(benign[:cut][None]), benign[cut - window + 1 :][None], test_series[None])
    return (
        windows(fit[0], None, window),
        windows(val[0], None, window),
        windows(test[0], np.asarray(test_labels).astype(int), window),
        benign.shape[1],
    )


# ---------------------------------------------------------------------- models
def build_model(task: str, channels: int, steps: int, classes: int, args) -> torch.nn.Module:
    common = dict(
        num_input_channels=channels, context_length=steps, patch_length=1, patch_stride=1, d_model=args.d_model,
        num_attention_heads=args.heads, num_hidden_layers=args.layers, ffn_dim=args.ffn_dim, scaling=None,
        dropout=args.dropout, head_dropout=args.dropout, attention_dropout=0.0, ff_dropout=0.0,
        positional_dropout=0.0, path_dropout=0.0, norm_type=args.norm_type,
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
        method="biprop", target_modules=args.target_modules, keep_ratio=keep_ratio, weight_seed=seed,
        attention=None if args.no_attention_option else attention,
    )
    return apply_compression(model, config)


def step_t_prediction(model, values: torch.Tensor, zero_current: bool, instance_norm: bool = True) -> torch.Tensor:
    """The model's output at the last step (batch × channels), with that step's input zeroed if asked.

    ``instance_norm``: each window is scaled by the mean/std of its history (steps before t) and the output scaled
    back (RevIN, what PatchTST's own scalers do), so level shifts between the training and test periods (e.g.
    spring temperatures after a winter training set) do not push the inputs out of the range the model was trained
    on. The history statistics never see x_t.
    """
    loc = values[:, :-1].mean(dim=1, keepdim=True) if instance_norm else torch.zeros_like(values[:, :1])
    scale = values[:, :-1].std(dim=1, keepdim=True) + 1e-5 if instance_norm else torch.ones_like(values[:, :1])
    inputs = (values - loc) / scale
    if zero_current:
        inputs[:, -1] = 0.0
    out = model(past_values=inputs).prediction_output  # (batch, channels, steps, 1)
    return out[:, :, -1, 0] * scale[:, 0] + loc[:, 0]


def loss_of(task: str, model, values, observed, targets, args):
    if task == "classification":
        return model(past_values=values, past_observed_mask=observed, target_values=targets).loss
    prediction = step_t_prediction(
        model, values, task == "forecasting" or args.zero_current, not args.no_instance_norm
    )
    return torch.nn.functional.mse_loss(prediction, values[:, -1])  # loss on step t only


def train(task: str, model, fit: Split, args, accelerator: Accelerator, label: str) -> float:
    scores = [p for n, p in model.named_parameters() if n.endswith("scores")]
    others = [p for n, p in model.named_parameters() if not n.endswith("scores")]
    groups = [{"params": others, "lr": args.lr, "weight_decay": args.weight_decay}]
    if scores:  # biprop scores need a larger step than weights (their scale is arbitrary; only the order matters)
        groups.append({"params": scores, "lr": args.score_lr, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups)
    data = torch.utils.data.TensorDataset(
        torch.tensor(fit.values), torch.tensor(fit.observed), torch.tensor(fit.targets, dtype=torch.long)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=len(data) > args.batch_size)
    steps = args.epochs * len(loader) if args.max_steps is None else args.max_steps
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[g["lr"] for g in groups], total_steps=max(steps, 1), pct_start=0.1
    )
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    model.train()
    start, step = time.perf_counter(), 0
    bar = tqdm(total=steps, desc=label, disable=not accelerator.is_local_main_process, leave=False)
    while step < steps:
        for values, observed, targets in loader:
            loss = loss_of(task, model, values, observed, targets, args)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if step >= steps:
                break
    bar.close()
    return time.perf_counter() - start


@torch.no_grad()
def predict(task: str, model, split: Split, args) -> np.ndarray:
    """Class ids (classification) or step-t squared errors per window (mean over channels)."""
    model.eval()
    device = next(p for p in [*model.parameters(), *model.buffers()]).device
    outputs = []
    for start in range(0, len(split.values), args.eval_batch_size):
        values = torch.tensor(split.values[start : start + args.eval_batch_size], device=device)
        if task == "classification":
            observed = torch.tensor(split.observed[start : start + args.eval_batch_size], device=device)
            outputs.append(model(past_values=values, past_observed_mask=observed).prediction_logits.argmax(-1).cpu())
        else:
            prediction = step_t_prediction(
                model, values, task == "forecasting" or args.zero_current, not args.no_instance_norm
            )
            outputs.append(torch.stack([(prediction - values[:, -1]) ** 2, (prediction - values[:, -1]).abs()], -1).cpu())
    return torch.cat(outputs).numpy()


# ---------------------------------------------------------------------- anomaly thresholds and scoring
def pot_threshold(scores: np.ndarray, risk: float, initial_quantile: float) -> float:
    """Peaks over threshold (Siffer et al. 2017): fit a generalised Pareto to the excesses over an initial
    threshold ``t`` and return the score exceeded with probability ``risk``: ``t + σ/γ ((risk·n/N_t)^(-γ) − 1)``."""
    initial = float(np.quantile(scores, initial_quantile))
    excesses = scores[scores > initial] - initial
    gamma, _, sigma = genpareto.fit(excesses, floc=0.0)
    ratio = risk * len(scores) / len(excesses)
    if abs(gamma) < 1e-6:
        return initial - sigma * np.log(ratio)
    return initial + sigma / gamma * (ratio ** (-gamma) - 1.0)


def point_adjust(predicted: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """If any point of a true anomaly segment is flagged, the whole segment counts as detected."""
    adjusted = predicted.copy()
    edges = np.flatnonzero(np.diff(np.concatenate([[0], labels, [0]])))
    for begin, end in zip(edges[::2], edges[1::2]):
        if adjusted[begin:end].any():
            adjusted[begin:end] = True
    return adjusted


def detection_scores(predicted: np.ndarray, labels: np.ndarray) -> dict:
    adjusted = point_adjust(predicted.astype(bool), labels.astype(int))
    tp = int((adjusted & (labels == 1)).sum())
    precision = tp / max(int(adjusted.sum()), 1)
    recall = tp / max(int((labels == 1).sum()), 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def evaluate_run(task: str, model, val: Split, test: Split, args) -> dict:
    if task == "classification":
        return {
            "val_accuracy": float((predict(task, model, val, args) == val.targets).mean()),
            "accuracy": float((predict(task, model, test, args) == test.targets).mean()),
        }
    errors = predict(task, model, test, args)
    if task == "forecasting":
        return {"mse": float(errors[..., 0].mean()), "mae": float(errors[..., 1].mean())}
    val_scores = predict(task, model, val, args)[..., 0].mean(-1)
    test_scores = errors[..., 0].mean(-1)
    manual = float(np.quantile(val_scores, 1.0 - args.manual_tau))
    pot = float(pot_threshold(val_scores, args.pot_risk, args.pot_level))
    metrics = {f"manual_{k}": v for k, v in detection_scores(test_scores > manual, test.targets).items()}
    metrics |= {f"pot_{k}": v for k, v in detection_scores(test_scores > pot, test.targets).items()}
    return metrics | {"manual_threshold": manual, "pot_threshold": pot}


# ---------------------------------------------------------------------- the experiment
def directory_bytes(path: Path, pattern: str = "*.safetensors") -> int:
    return sum(f.stat().st_size for f in path.glob(pattern))


def markdown_table(results: dict) -> str:
    """Mean (± std) over seeds per configuration."""
    rows, by_name = [], {}
    for run in results["runs"]:
        by_name.setdefault(run["name"], []).append(run)
    metric_names = list(results["runs"][0]["metrics"])
    header = ["run", "keep_ratio", "seeds", *metric_names, "params", "storage_bits", "nonzero_flops", "checkpoint_bytes"]
    rows.append("| " + " | ".join(header) + " |")
    rows.append("|" + "---|" * len(header))
    for name, runs in by_name.items():
        cells = [name, str(runs[0]["keep_ratio"]), str(len(runs))]
        for metric in metric_names:
            values = np.array([r["metrics"][metric] for r in runs])
            cells.append(f"{values.mean():.4f} ± {values.std():.4f}")
        cells += [str(runs[0][k]) for k in ("params", "storage_bits", "nonzero_flops", "checkpoint_bytes")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


TASK_DEFAULTS = {
    "classification": dict(epochs=40, lr=2e-3, score_lr=0.05, batch_size=32, d_model=32, heads=2, ffn_dim=64, dropout=0.1),
    "forecasting": dict(epochs=2, lr=1e-3, score_lr=0.05, batch_size=64, d_model=32, heads=2, ffn_dim=64, dropout=0.0),
    "anomaly": dict(epochs=8, lr=1e-3, score_lr=0.05, batch_size=32, d_model=16, heads=2, ffn_dim=32, dropout=0.0),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASK_DEFAULTS), required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--dataset", default="JapaneseVowels", help="classification: aeon/UEA dataset name")
    parser.add_argument("--data", default=None, help="forecasting/anomaly: a CSV (anomaly: with a 'label' column)")
    parser.add_argument("--model_path", default=None, help="start from this PatchTST checkpoint instead of a fresh one")
    parser.add_argument("--keep_ratios", type=float, nargs="*", default=[0.75, 0.5, 0.25], help="none: dense only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target_modules", default="all-linear", help="'all-linear' (paper) or a regex / None")
    parser.add_argument("--no_attention_option", action="store_true", help="biprop without Q/K/V masks / Step-T")
    parser.add_argument("--window", type=int, default=50, help="forecasting/anomaly window w")
    parser.add_argument("--stride", type=int, default=10, help="forecasting: stride between windows (train, validation and test)")
    parser.add_argument("--limit_rows", type=int, default=None, help="forecasting: use only the first N rows")
    parser.add_argument("--validation", type=float, default=0.2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--norm_type", choices=["batchnorm", "layernorm"], default="batchnorm",
        help="batchnorm for every task: with one value per token (patch length 1), LayerNorm over d_model erases "
        "the value's magnitude (the paper's LayerNorm for forecasting saw all m features in one token)",
    )
    for name, kind in (("epochs", int), ("lr", float), ("score_lr", float), ("batch_size", int), ("d_model", int),
                       ("heads", int), ("ffn_dim", int), ("dropout", float)):
        parser.add_argument(f"--{name}", type=kind, default=None)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--max_steps", type=int, default=None, help="cap on optimizer steps (smoke tests)")
    parser.add_argument("--eval_batch_size", type=int, default=256)
    parser.add_argument(
        "--reconstruct_current", dest="zero_current", action="store_false",
        help="anomaly: feed x_t to the model (reconstruct it) instead of zeroing it (predict x_t from earlier steps)",
    )
    parser.add_argument("--no_instance_norm", action="store_true", help="forecasting/anomaly: no per-window scaling")
    parser.add_argument("--manual_tau", type=float, default=0.01, help="anomaly: flag the top tau of validation scores")
    parser.add_argument("--pot_risk", type=float, default=1e-3)
    parser.add_argument("--pot_level", type=float, default=0.98)
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
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.task == "classification":
        fit, val, test, classes = load_classification(args.dataset, None, args.validation, seed=0)
        dataset = f"UEA {args.dataset} (aeon)"
    elif args.task == "forecasting":
        fit, val, test, classes = load_forecasting(args.data, args.window, args.stride, args.limit_rows)
        dataset = args.data or "UCI Appliances Energy (26 channels, rv1/rv2 dropped)"
    else:
        fit, val, test, classes = load_anomaly(args.data, args.window, args.validation)
        dataset = args.data or "KDD-TSAD_135 (aeon)"
    channels, steps = fit.values.shape[2], fit.values.shape[1]
    sample = {"past_values": torch.tensor(test.values[:1])}
    results = {"task": args.task, "dataset": dataset, "args": vars(args), "runs": []}
    if args.task == "forecasting":  # context for the MSE/MAE figures: predict x_t = x_{t-1}
        error = test.values[:, -1] - test.values[:, -2]
        results["persistence_baseline"] = {"mse": float((error**2).mean()), "mae": float(np.abs(error).mean())}
    for keep_ratio in [None, *args.keep_ratios]:
        for seed in args.seeds:
            name = "dense" if keep_ratio is None else f"biprop-{keep_ratio}"
            torch.manual_seed(seed)
            np.random.seed(seed)
            model = compress(build_model(args.task, channels, steps, classes, args), args.task, keep_ratio, seed, args)
            seconds = train(args.task, model, fit, args, accelerator, f"{name} seed {seed}")
            model = accelerator.unwrap_model(model).cpu()
            metrics = evaluate_run(args.task, model, val, test, args)
            checkpoint = out / "checkpoints" / f"{name}-seed{seed}"
            if accelerator.is_main_process:
                model.save_pretrained(checkpoint)
            run = {
                "name": name, "keep_ratio": keep_ratio if keep_ratio is not None else 1.0, "seed": seed, "metrics": metrics,
                "params": sum(
                    m.binary_parameters() if hasattr(m, "binary_parameters") else sum(p.numel() for p in m.parameters(recurse=False))
                    for m in model.modules()
                ),
                "storage_bits": storage_bits(model),
                "nonzero_flops": nonzero_flops(model.eval(), **sample)["total"],
                "checkpoint_bytes": directory_bytes(checkpoint),
                "train_seconds": round(seconds, 2),
            }
            results["runs"].append(run)
            accelerator.print(json.dumps({k: run[k] for k in ("name", "seed", "metrics", "train_seconds")}))
    if accelerator.is_main_process:
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        baseline = results.get("persistence_baseline")
        note = f"\nPersistence baseline (x_t = x_(t-1)) on the same test windows: {baseline}\n" if baseline else ""
        (out / "results.md").write_text(f"# SBT {args.task}: {dataset}\n\n" + markdown_table(results) + note)
        accelerator.print(markdown_table(results))
    return results


if __name__ == "__main__":
    main()
