"""Smartformer, the project's main job: CP attention with ranks chosen by reinforcement learning while training.

    accelerate launch recipes/smartformer.py                     # Autoformer on Appliances Energy, horizon 96
    accelerate launch recipes/smartformer.py --model patchtst --horizon 192 --seeds 0 1 2
    accelerate launch recipes/smartformer.py --model patchtst --size medium --seeds 0 1 2   # attention 35 % of the model
    accelerate launch recipes/smartformer.py --dataset my.csv --output-dir out/ --full
    python recipes/smartformer.py --model patchtst --dataset air.csv --timestamp-columns year month day hour \
        --drop-columns No --target pm2.5 --covariates TEMP cbwd --one-hot cbwd
    python recipes/smartformer.py --model patchtst --dataset long.csv --id-column unique_id --target y
    accelerate launch recipes/smartformer.py --model patchtst --model-path my-dense-patchtst/

The data flags (``--dataset``, ``--timestamp-column(s)``, ``--id-column``, ``--target``, ``--covariates``,
``--one-hot``, ...) are the library's ``data.arguments``; what was read is printed before training, and a file the
flags do not explain (text columns, calendar fields, duplicated times) stops with one ``error:`` line saying what
to pass. Missing values are masked in the loss and in every metric; covariates are inputs, never scored.

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
Writes ``results.json``, ``results.md`` (a table like the paper's Tables 3–8), the search trace and its plot, and
the Smartformer model (``save_pretrained``: config with compression_config, safetensors, remote code, model card).
Every run is scored on the test windows with the weights of its best validation MSE (checked every few steps;
``--keep-last`` scores the final weights). Autoformer/Informer are trained on the MSE of their forecast mean,
like the original Autoformer (the HF models' default is a Student-t likelihood, whose negative values would break
the paper's loss-ratio reward).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    AutoformerConfig,
    AutoformerForPrediction,
    AutoModel,
    InformerConfig,
    InformerForPrediction,
    PatchTSTConfig,
    PatchTSTForPrediction,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

from hf_tensorcompress import CompressionConfig, apply_compression, compression_report
from hf_tensorcompress.baselines import quantization
from hf_tensorcompress.compress import refresh_compression_config
from hf_tensorcompress.core.metrics import linear_bytes, linear_modules
from hf_tensorcompress.core.targets import attention_projections, family_of
from hf_tensorcompress.data import (
    NUM_TIME_FEATURES,
    describe_forecasting,
    describe_source,
    forecasting_windows,
    standardization_of,
)
from hf_tensorcompress.data.arguments import add_forecasting_arguments, load_forecasting_from_args
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.evaluation.pareto import kind_of, write_pareto
from hf_tensorcompress.evaluation.tables import runs_table
from hf_tensorcompress.runtime.atomic import atomic_folder
from hf_tensorcompress.search import SearchConfig, attention_groups
from hf_tensorcompress.search.baselines import module_ranks, random_ranks, total_params, uniform_ranks
from hf_tensorcompress.search.schedule import RankSchedule
from hf_tensorcompress.training.forecasting import (
    BestValidation,
    ForecastSmartformerTrainer,
    ForecastTrainer,
    point_forecast_for_training,
)
from hf_tensorcompress.usage import user_errors

FAMILIES = ("autoformer", "patchtst", "informer")


@dataclass(frozen=True)
class Size:
    """Model size and training length; the defaults finish in minutes on 2 CPU cores, ``--full`` is the paper's."""

    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    ffn: int
    steps: int
    batch_size: int
    train_stride: int
    eval_stride: int
    interval: int
    consecutive_actions: int
    max_actions_per_layer: int
    grid: tuple[float, ...]
    validate_every: int


SMALL = Size(32, 4, 2, 1, 64, 600, 32, 8, 16, 8, 3, 6, (0.3, 0.6, 1.0), 25)
#: ``--size medium``: where the attention projections are a real share of the model (see the README's table).
MEDIUM = Size(128, 8, 2, 1, 256, 200, 16, 8, 16, 8, 3, 6, (), 25)
FULL = Size(512, 8, 2, 1, 2048, 3000, 32, 1, 1, 100, 5, 15, tuple(k / 10 for k in range(1, 11)), 100)
SIZES = {"demo": SMALL, "medium": MEDIUM, "full": FULL}


CLASSES = {"autoformer": AutoformerForPrediction, "patchtst": PatchTSTForPrediction, "informer": InformerForPrediction}


def build_model(family: str, channels: int, context: int, horizon: int, size: Size, seed: int, path: str | None = None):
    """A fresh model of ``family`` (seeded), or the dense checkpoint at ``path`` (its config sets the shapes)."""
    torch.manual_seed(seed)
    if path is not None:
        model = CLASSES[family].from_pretrained(path)
        if getattr(model.config, "compression_config", None):
            raise ValueError(f"--model-path {path} is already compressed; the comparison starts from a dense model")
        return model
    if family == "patchtst":
        config = PatchTSTConfig(
            num_input_channels=channels,
            context_length=context,
            prediction_length=horizon,
            patch_length=16,
            patch_stride=8,
            d_model=size.d_model,
            num_attention_heads=size.heads,
            num_hidden_layers=size.encoder_layers,
            ffn_dim=size.ffn,
        )
        return PatchTSTForPrediction(config)
    common = dict(
        input_size=channels,
        context_length=context,
        prediction_length=horizon,
        num_time_features=NUM_TIME_FEATURES,
        d_model=size.d_model,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn,
        lags_sequence=[1, 2, 3, 4, 5, 6, 7],
    )
    if family == "autoformer":
        return AutoformerForPrediction(AutoformerConfig(label_length=context // 2, **common))
    return InformerForPrediction(InformerConfig(attention_type="full", num_parallel_samples=20, **common))


def qkv_names(model: torch.nn.Module) -> list[str]:
    """The q/k/v projections of the family's attention modules, whatever replaced them (dense, compressed, quantized)."""
    family = family_of(model)
    return [
        f"{name}.{projection}"
        for name, module in model.named_modules()
        if type(module).__name__ in family.attention_classes
        for projection in family.projections
        if hasattr(module, projection)
    ]


def attention_params(model: torch.nn.Module) -> int:
    """Parameters of the attention q/k/v projections (dense Linear or their compressed replacement)."""
    return sum(p.numel() for name in qkv_names(model) for p in model.get_submodule(name).parameters())


def projection_flops(model: torch.nn.Module) -> int:
    """FLOPs of the q/k/v projections for one token (a multiply-add counts 2), at the path each layer takes."""
    compressed = {}
    if getattr(model.config, "compression_config", None):
        compressed = {row["name"]: row["flops"] for row in compression_report(model, tokens=1)["modules"]}
    return sum(
        compressed[name]
        if name in compressed
        else 2 * model.get_submodule(name).in_features * model.get_submodule(name).out_features
        for name in qkv_names(model)
    )


def model_flops(model: torch.nn.Module, windows) -> int:
    """FLOPs of one forward of the whole model on one window (counted by torch, so every layer is in it: embedding,
    attention, feed-forward, head; the training-mode forward, teacher-forced for Autoformer/Informer)."""
    batch = {key: value.unsqueeze(0) for key, value in windows[0].items() if isinstance(value, torch.Tensor)}
    was_training = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        point_forecast_for_training(model, batch)
    model.train(was_training)
    return int(counter.get_total_flops())


def run_one(
    name: str,
    method: str | None,
    rank,
    search: SearchConfig | None,
    seed: int,
    args,
    size: Size,
    data,
    switch_at: int | None = None,
    prepare: Callable | None = None,
):
    """Train one arm. ``rank``: one rank (int, or a parameter ratio) for every projection, or ``{module: rank}``;
    with ``switch_at`` the model trains at full rank (like a search's start) and takes those ranks after that step.
    ``prepare(model, final_ranks or None)`` builds an arm of its own (quantization-aware training, every Linear
    low-rank) instead of ``method`` and returns the disk bytes of modules deployed in another form than trained."""
    train, validation, test = data
    output_dir = os.path.join(args.output_dir, "runs", f"{name}-seed{seed}")
    checkpoint = get_last_checkpoint(output_dir) if args.resume and os.path.isdir(output_dir) else None
    schedule_at = switch_at
    if switch_at is not None and checkpoint and int(checkpoint.rsplit("-", 1)[1]) >= switch_at:
        schedule_at = None  # saved after the cut: build the model at its final ranks, the checkpoint's shapes
    model = build_model(args.model, args.channels, args.context, args.horizon, size, seed, args.model_path)
    packed = None
    if prepare is not None:
        packed = prepare(model, rank if schedule_at is None else None)
    elif method is not None:
        per_module = rank if isinstance(rank, dict) and schedule_at is None else {}
        apply_compression(
            model, CompressionConfig(method=method, rank=1.0 if isinstance(rank, dict) else rank, ranks=per_module)
        )
    training = TrainingArguments(
        output_dir,
        max_steps=size.steps,
        per_device_train_batch_size=size.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        report_to=[],
        logging_steps=50,
        seed=seed,
        data_seed=seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_drop_last=True,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
    )
    if search is not None:
        trainer = ForecastSmartformerTrainer(
            model=model, args=training, train_dataset=train, eval_dataset=validation, search=search
        )
    else:
        trainer = ForecastTrainer(model=model, args=training, train_dataset=train)
    schedule = None
    if schedule_at is not None:
        schedule = RankSchedule(trainer, schedule_at, rank)
        trainer.add_callback(schedule)  # before model selection: a check at the switch step sees the new shapes
    selection = None
    if not args.keep_last:
        final_shape = None if schedule is None else (lambda: schedule.done)
        selection = BestValidation(trainer, validation, size.validate_every, size.batch_size, final_shape)
        trainer.add_callback(selection)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start
    model = trainer.model
    ranks = {}
    if method is not None:
        ranks = {group.name: model.get_submodule(group.modules[0]).rank for group in attention_groups(model)}
    elif prepare is not None and getattr(model.config, "compression_config", None):
        ranks = {name: spec["rank"] for name, spec in model.config.compression_config["modules"].items()}
    result = {
        "name": name,
        "seed": seed,
        "metrics": evaluate_forecaster(model, test, batch_size=size.batch_size, progress=False),
        "validation_mse": None if selection is None or selection.best is None else selection.best[0],
        "steps": size.steps,
        "selected_step": size.steps if selection is None or selection.best is None else selection.best[1],
        "params": sum(p.numel() for p in model.parameters()),
        "attention_params": attention_params(model),
        **byte_counts(model, packed),
        "flops": projection_flops(model),
        "model_flops": model_flops(model, test),
        "ranks": ranks,
        "agent_seed": None if search is None else search.seed,
        "switch_step": switch_at,
        "train_seconds": round(seconds, 2),
        "resumed_from": checkpoint and os.path.basename(checkpoint),
    }
    if PartialState().num_processes > 1:  # what every process holds (the search decides on one and broadcasts)
        result["ranks_per_process"] = gather_object([ranks])
    return result, trainer


def byte_counts(model: torch.nn.Module, packed: dict[str, int] | None = None) -> dict:
    """Bytes of every Linear layer and of the q/k/v projections, on disk and in RAM, and their fractions of fp32."""
    counted = linear_bytes(model, packed)
    qkv = [counted["modules"][name] for name in qkv_names(model)]
    attention = {key: sum(row[key] for row in qkv) for key in ("dense", "disk", "ram")}
    return {
        "linear_bytes": {key: counted[key] for key in ("dense", "disk", "ram", "disk_ratio", "ram_ratio")},
        "attention_bytes": {
            **attention,
            "disk_ratio": attention["disk"] / attention["dense"],
            "ram_ratio": attention["ram"] / attention["dense"],
        },
    }


def scope_names(model: torch.nn.Module, scope: str) -> list[str]:
    """The Linear layers an arm quantizes or factorizes: ``qkv`` (the attention projections) or ``all``."""
    return attention_projections(model) if scope == "qkv" else list(linear_modules(model))


#: Post-training quantization of each seed's dense run (``ptq-<scheme>-<scope>``; no training of their own).
PTQ_ARMS = tuple(f"ptq-{scheme}-{scope}" for scope in ("qkv", "all") for scheme in quantization.SCHEMES)
#: Ternary quantization-aware training from the first step, at the same steps (``qat-ternary-<scope>``).
QAT_ARMS = ("qat-ternary-qkv", "qat-ternary-all")
#: Bits and group size the factors of every ``svd-all`` run are also stored in after training (``<run>+<name>``,
#: through ``LowRankLinear.set_factor_bits``, then saved and loaded back); ``-q4`` arms train with 4-bit factors.
FACTOR_SCHEMES = {"int8": (8, None), "int4": (4, 32), "int2": (2, 32)}
TRAINED_FACTOR_BITS = (4, 32)


def prepare_ternary(scope: str) -> Callable:
    """An arm's ``prepare``: ternary QAT of ``scope``; its layers deploy as 2-bit codes plus a scale."""

    def prepare(model: torch.nn.Module, final_ranks) -> dict[str, int]:
        names = scope_names(model, scope)
        quantization.ternary_training(model, names)
        return {
            name: quantization.ternary_bytes(m.out_features, m.in_features)
            + (m.bias.numel() * 4 if m.bias is not None else 0)
            for name in names
            for m in [model.get_submodule(name)]
        }

    return prepare


#: Layers with a side this narrow stay dense in the ``svd-all`` arms: PatchTST's patch embedding (16 inputs) at
#: half its parameters keeps rank 7, and that alone took the test MSE of seed 0 from 0.48 to 0.72.
NARROWEST_FACTORED = 32


def low_rank_targets(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The Linear layers the ``svd-all`` arms factor: every one with both sides >= ``NARROWEST_FACTORED``."""
    return {
        name: m for name, m in linear_modules(model).items() if min(m.in_features, m.out_features) >= NARROWEST_FACTORED
    }


def svd_all_ranks(model: torch.nn.Module, ratio: float) -> dict[str, int]:
    """The SVD rank of every factored Linear at ``ratio`` of its weight parameters."""
    return {
        name: max(
            1,
            min(
                min(m.in_features, m.out_features),
                int(ratio * m.in_features * m.out_features / (m.in_features + m.out_features)),
            ),
        )
        for name, m in low_rank_targets(model).items()
    }


def prepare_svd_all(ratio: float, factor_bits: tuple[int, int | None] | None = None) -> Callable:
    """An arm's ``prepare``: every Linear but the narrowest becomes ``U Vᵀ``, at ``ratio`` of its parameters, or at full rank
    (``min(in, out)``, the dense weight exactly) when a schedule cuts it later; ``factor_bits`` (bits, group):
    the factors train rounded to those bits from the first step."""
    bits, group = factor_bits or (None, None)

    def prepare(model: torch.nn.Module, final_ranks) -> None:
        ranks = final_ranks or {name: min(m.in_features, m.out_features) for name, m in low_rank_targets(model).items()}
        apply_compression(
            model,
            CompressionConfig(
                method="svd",
                target_modules=list(ranks),
                rank=1.0,
                ranks=ranks,
                factor_bits=bits,
                factor_group_size=group,
            ),
        )

    return prepare


def reloaded(model: torch.nn.Module, folder: str) -> torch.nn.Module:
    """``model`` saved with ``save_pretrained`` and loaded back by its transformers class (the inference form)."""
    model.save_pretrained(folder)
    return CLASSES[model.config.model_type].from_pretrained(folder).eval()


def post_training_arm(
    name: str, source: dict, model: torch.nn.Module, transform: Callable, data, size: Size, folder: str | None = None
) -> dict:
    """An arm that rounds a trained run's weights (no training): ``transform(copy)`` quantizes a copy of ``model``
    and returns the disk bytes it overrides (if any); with ``folder`` the copy is then saved there and loaded back,
    and the loaded model is scored and counted. Scored on the same test windows as its source run."""
    quantized = copy.deepcopy(model).eval()
    packed = transform(quantized)
    if folder is not None:
        quantized = reloaded(quantized, folder)
    return {
        **source,
        "name": name,
        "source": source["name"],
        "train_seconds": 0.0,
        "metrics": evaluate_forecaster(quantized, data[2], batch_size=size.batch_size, progress=False),
        **byte_counts(quantized, packed),
    }


def ptq_transform(scheme: str, scope: str) -> Callable:
    def transform(model: torch.nn.Module) -> None:
        quantization.quantize_linears(model, scope_names(model, scope), scheme)

    return transform


def factor_transform(bits: int, group: int | None) -> Callable:
    """Store every low-rank layer's factors in ``bits`` (the library's ``factor_bits``), spec re-recorded."""

    def transform(model: torch.nn.Module) -> None:
        for module in model.modules():
            if hasattr(module, "set_factor_bits"):
                module.set_factor_bits(bits, group)
        refresh_compression_config(model)

    return transform


#: Arms derived from each seed's Smartformer run: its final attention parameter count, spent other ways; the
#: ``-scheduled`` ones train at full rank until the step the search ended and take their ranks there.
DERIVED = ("uniform-cp", "random-ranks", "searched-ranks", "uniform-cp-scheduled", "random-ranks-scheduled")


def derived_arms(name: str, groups, ranks: dict[str, int], seed: int, draws: int) -> list[tuple[str, dict, int | None]]:
    """(run name, {module: rank}, draw) of a derived arm at the search's final parameter count: one rank in every
    layer (closest count), ``draws`` random assignments (never above the count, within one rank-1 component of
    it), or the search's own final ranks trained from the start. A ``-scheduled`` name gets the same ranks as
    its base arm (the same draws too)."""
    params = total_params(groups, ranks)
    base = name.removesuffix("-scheduled")
    if base == "uniform-cp":
        return [(name, module_ranks(groups, uniform_ranks(groups, params)), None)]
    if base == "random-ranks":
        return [
            (name, module_ranks(groups, random_ranks(groups, params, random.Random(1000 * seed + draw))), draw)
            for draw in range(draws)
        ]
    return [(name, module_ranks(groups, ranks), None)]


def search_end_step(trace: list[dict]) -> int:
    """The optimizer step at which the search decided its last layer (its last decision if it never finished)."""
    if not trace:  # no stage ended (a run shorter than one interval): nothing was cut, so nothing to wait for
        return 1
    return next((record["step"] for record in trace if record["done"]), trace[-1]["step"])


def run_header(index: int, total: int, name: str, seconds: list[float]) -> str:
    """The line before each run, so a job of several runs says where it is and how long is left:
    ``[2/6] smartformer: about 2.2 min, 11 min left in all``. The estimate is the mean wall time of the runs before
    it (every run trains for the same steps; a search run costs about as much as a fixed-rank one), so the first
    run has none."""
    if not seconds:
        return f"[{index}/{total}] {name}: time estimate after this run"
    mean = sum(seconds) / len(seconds)
    return f"[{index}/{total}] {name}: about {mean / 60:.1f} min, {mean * (total - index + 1) / 60:.0f} min left in all"


def markdown(results: dict) -> str:
    """Mean (± std) over seeds per run name, like the paper's tables; every run trained for the same steps."""
    dense = next((r["attention_params"] for r in results["runs"] if r["name"] == "dense"), None)
    runs = [
        {
            **run,
            "metrics": {**run["metrics"], "seconds": run["train_seconds"]},
            "attention_ratio": f"{run['attention_params'] / dense:.2f}" if dense else "-",
            "attention_disk": f"{run['attention_bytes']['disk']:,} ({run['attention_bytes']['disk_ratio']:.3f}×)",
            "attention_ram": f"{run['attention_bytes']['ram']:,} ({run['attention_bytes']['ram_ratio']:.3f}×)",
            "linear_disk": f"{run['linear_bytes']['disk']:,} ({run['linear_bytes']['disk_ratio']:.3f}×)",
            "linear_ram": f"{run['linear_bytes']['ram']:,} ({run['linear_bytes']['ram_ratio']:.3f}×)",
        }
        for run in results["runs"]
    ]
    table = runs_table(
        runs,
        {"mse": "MSE", "mae": "MAE", "seconds": "train s"},
        {
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
        },
    )
    return (
        f"### {results['model']} on {results['dataset']}, horizon {results['horizon']}\n\n{table}\n"
        f"Every run: {results['steps']} optimizer steps, scored with the weights of its best validation MSE "
        f"(checked every {results['validate_every']} steps){'; --keep-last: final weights' if results['keep_last'] else ''}.\n"
    )


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


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Smartformer: RL-searched CP attention, compared with dense, SVD and fixed ranks."
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
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps of every run, the same for each (default by size: demo 600, medium 200, full 3000)",
    )
    parser.add_argument(
        "--grid", type=float, nargs="*", default=None, help="fixed-rank CP parameter ratios (default by size)"
    )
    parser.add_argument("--runs", nargs="*", default=None, help="only these run names (e.g. dense smartformer)")
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
        "--keep-last",
        action="store_true",
        help="score the final weights instead of those with the best validation MSE (checked every few steps)",
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
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    size = FULL if args.full else SIZES[args.size]
    with user_errors("smartformer.py"):
        for flag in ("random_draws", "validation_batches", "save_steps"):
            value = getattr(args, flag)
            if value is not None and value < 1:
                raise ValueError(f"--{flag.replace('_', '-')} {value} must be >= 1")
        if args.steps is not None or args.grid is not None:
            if args.steps is not None and args.steps < 1:
                raise ValueError(f"--steps {args.steps} must be >= 1")
            size = Size(
                **{
                    **size.__dict__,
                    "steps": args.steps or size.steps,
                    "grid": tuple(args.grid if args.grid is not None else size.grid),
                }
            )
        dataset = load_forecasting_from_args(args)
        args.channels = len(standardization_of(dataset["train"]).columns)
        if PartialState().is_main_process:
            print(describe_forecasting(dataset, describe_source(args.dataset)))
        shape_model = build_model(args.model, args.channels, args.context, args.horizon, size, 0, args.model_path)
        data = (
            forecasting_windows(dataset["train"], shape_model.config, stride=size.train_stride, future_mask=True),
            forecasting_windows(dataset["validation"], shape_model.config, stride=size.eval_stride),
            forecasting_windows(dataset["test"], shape_model.config, stride=size.eval_stride),
        )
    search = lambda seed, reward="loss": SearchConfig(  # noqa: E731  (a fresh config per run: the trainer keeps it)
        seed=seed,
        interval=size.interval,
        consecutive_actions=size.consecutive_actions,
        max_actions_per_layer=size.max_actions_per_layer,
        param_budget=args.budget,
        reward=reward,
        validation_batches=args.validation_batches,
    )
    plan = [("dense", None, 1.0, None), ("smartformer", "cp", 1.0, search)]
    plan += [("smartformer-validation-reward", "cp", 1.0, lambda seed: search(seed, "validation_loss"))]
    plan += [("svd-smartformer", "svd", 1.0, search)]
    plan += [(f"cp-fixed-{ratio:g}", "cp", ratio, None) for ratio in size.grid]
    plan += [(name, "cp", None, None) for name in DERIVED]
    plan += [(name, None, None, None) for name in (*PTQ_ARMS, *QAT_ARMS)]
    prepares = {name: prepare_ternary(name.rpartition("-")[2]) for name in QAT_ARMS}
    post_arms = {name: ("dense", ptq_transform(*name.split("-")[1:])) for name in PTQ_ARMS}
    switch_step = args.switch_step or size.steps // 2
    with user_errors("smartformer.py"):
        if not 1 <= switch_step < size.steps:
            raise ValueError(f"--switch-step {switch_step} must be in [1, {size.steps}) (the runs' steps)")
        if any(not 0.0 < ratio <= 1.0 for ratio in args.all_linear_ratios):
            raise ValueError(f"--all-linear-ratios {args.all_linear_ratios}: each must be in (0, 1]")
    for ratio in args.all_linear_ratios:
        for trained_bits in ("", f"-q{TRAINED_FACTOR_BITS[0]}"):
            for suffix in ("", "-scheduled"):
                name = f"svd-all-{ratio:g}{trained_bits}{suffix}"
                plan.append((name, None, svd_all_ranks(shape_model, ratio), None))
                prepares[name] = prepare_svd_all(ratio, TRAINED_FACTOR_BITS if trained_bits else None)
                for scheme, bits in FACTOR_SCHEMES.items():
                    if not trained_bits:
                        plan.append((f"{name}+{scheme}", None, None, None))
                        post_arms[f"{name}+{scheme}"] = (name, factor_transform(*bits))
    if args.runs is not None:
        unknown = sorted(set(args.runs) - {entry[0] for entry in plan})
        if unknown or (set(args.runs) & set(DERIVED) and "smartformer" not in args.runs):
            with user_errors("smartformer.py"):
                if unknown:
                    raise ValueError(f"--runs {args.runs}: unknown {unknown}; choose from {[e[0] for e in plan]}")
                raise ValueError(
                    f"--runs {args.runs}: {sorted(set(args.runs) & set(DERIVED))} take their parameter count from "
                    "the Smartformer search of the same seed; add smartformer"
                )
        missing = sorted({post_arms[name][0] for name in args.runs if name in post_arms} - set(args.runs))
        if missing:
            with user_errors("smartformer.py"):
                raise ValueError(f"--runs {args.runs}: the post-training arms round the weights of {missing}; add them")
        plan = [entry for entry in plan if entry[0] in args.runs]
    results = {
        "model": args.model,
        "dataset": args.dataset or "appliances_energy",
        "horizon": args.horizon,
        "steps": size.steps,
        "validate_every": size.validate_every,
        "keep_last": args.keep_last,
        "runs": [],
    }
    os.makedirs(args.output_dir, exist_ok=True)
    smart_model = smart_dir = None
    total = len(args.seeds) * sum(args.random_draws if e[0].startswith("random-ranks") else 1 for e in plan)
    seconds: list[float] = []  # wall time of every run so far, for the next header's estimate

    def header(name: str) -> None:
        if PartialState().is_main_process:
            print(run_header(len(seconds) + 1, total, name, seconds), flush=True)

    for seed in args.seeds:
        searched = None  # (groups, final ranks, step its search ended) of this seed's Smartformer run
        trained = {}  # run name -> (result, trained model) of this seed: what the post-training arms round
        for name, method, rank, make_search in plan:
            if name in post_arms:
                header(name)
                started = time.monotonic()
                source, transform = post_arms[name]
                folder = None if name in PTQ_ARMS else os.path.join(args.output_dir, "runs", f"{name}-seed{seed}")
                result = post_training_arm(name, *trained[source], transform, data, size, folder)
                seconds.append(time.monotonic() - started)
                results["runs"].append(result)
                print(json.dumps({k: result[k] for k in ("name", "seed", "metrics", "linear_bytes")}))
                continue
            arms = [(name, rank, None)]
            if name in DERIVED:
                arms = derived_arms(name, *searched[:2], seed, args.random_draws)
            switch_at = None
            if name.endswith("-scheduled"):
                switch_at = switch_step if name in prepares else searched[2]
            for run_name, run_rank, draw in arms:
                header(run_name)
                started = time.monotonic()
                result, trainer = run_one(
                    run_name,
                    method,
                    run_rank,
                    make_search(seed) if make_search else None,
                    seed,
                    args,
                    size,
                    data,
                    switch_at,
                    prepares.get(name),
                )
                seconds.append(time.monotonic() - started)
                trained[run_name] = (result, trainer.model)
                if draw is not None:
                    result["draw"] = draw
                results["runs"].append(result)
                if trainer.is_world_process_zero():
                    print(
                        json.dumps(
                            {
                                k: result[k]
                                for k in ("name", "seed", "metrics", "attention_params", "linear_bytes", "ranks")
                            }
                        )
                    )
                    with open(os.path.join(args.output_dir, "results.json"), "w", encoding="utf-8") as handle:
                        json.dump(results, handle, indent=2)  # after every run: a long job's finished runs are kept
            if name == "smartformer":
                searched = (trainer.search.groups, dict(trainer.search.ranks), search_end_step(trainer.search.trace))
            if name == "smartformer" and seed == args.seeds[0] and trainer.is_world_process_zero():
                smart_model, smart_dir = trainer.model, trainer.args.output_dir
    if not trainer.is_world_process_zero():
        return results
    with open(os.path.join(args.output_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    table = markdown(results)
    if any("linear_bytes" in run and kind_of(run["name"]) == "baseline" for run in results["runs"]):
        title = f"{args.model} on {results['dataset']}, horizon {args.horizon}, {len(args.seeds)} seeds"
        table += "\n### Best test MSE within each byte budget (every Linear weight)\n\n"
        table += write_pareto(results["runs"], "mse", args.output_dir, title, lower_is_better=True)
        table += "\nFigure: bytes_pareto.png (numbers: bytes_pareto.json).\n"
    with open(os.path.join(args.output_dir, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    if smart_model is not None:  # --runs without smartformer: nothing searched, no model to save
        for file in ("smartformer_trace.json", "smartformer_trace.png"):
            if os.path.exists(os.path.join(smart_dir, file)):
                os.replace(os.path.join(smart_dir, file), os.path.join(args.output_dir, file))
        save_smartformer(smart_model, results, os.path.join(args.output_dir, "smartformer-model"))
    print(table)
    return results


if __name__ == "__main__":
    main()
