"""How the Smartformer recipe trains one arm (Trainer, search, schedule, model selection) and scores it, and how a
post-training arm rounds a trained run."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.search import SearchConfig, attention_groups
from hf_tensorcompress.search.schedule import RankSchedule
from hf_tensorcompress.training.averaging import WeightAverage
from hf_tensorcompress.training.forecasting import BestValidation, ForecastSmartformerTrainer, ForecastTrainer

from .costs import attention_params, byte_counts, model_flops, projection_flops
from .forecasters import CLASSES, Size, build_model
from .narrow_arms import Shape, against_full_model, narrower


def training_arguments(output_dir: str, size: Size, seed: int, args) -> TrainingArguments:
    """The same optimizer, steps and checkpointing for every arm."""
    return TrainingArguments(
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
    teacher: torch.nn.Module | None = None,
    dense_steps: int | None = None,
    shape: Shape | None = None,
):
    """Train one arm. ``rank``: one rank (int, or a parameter ratio) for every projection, or ``{module: rank}``;
    with ``switch_at`` the model trains at full rank (like a search's start) and takes those ranks after that step.
    ``prepare(model, final_ranks or None)`` builds an arm of its own (quantization-aware training, every Linear
    low-rank) instead of ``method`` and returns the disk bytes of modules deployed in another form than trained.
    With ``teacher`` (this seed's dense run) the arm is distilled from it with ``--distill``'s weight. With
    ``dense_steps`` the model first trains dense for that many of the run's steps (its own linear learning-rate
    decay, no model selection), then ``prepare`` takes those weights and the rest of the steps train that form. With
    ``shape`` the arm trains a fresh model of that narrower ``d_model``, encoder layers and FFN (``narrow_arms.py``),
    its bytes counted against the full model's."""
    train, validation, test = data
    output_dir = os.path.join(args.output_dir, "runs", f"{name}-seed{seed}")
    checkpoint = get_last_checkpoint(output_dir) if args.resume and os.path.isdir(output_dir) else None
    schedule_at = switch_at
    if switch_at is not None and checkpoint and int(checkpoint.rsplit("-", 1)[1]) >= switch_at:
        schedule_at = None  # saved after the cut: build the model at its final ranks, the checkpoint's shapes
    full_model = None
    if shape is not None:
        full_model = build_model(args.model, args.channels, args.context, args.horizon, size, seed)
        size = narrower(size, shape)
    model = build_model(args.model, args.channels, args.context, args.horizon, size, seed, args.model_path)
    dense_seconds = 0.0
    if dense_steps is not None:
        if checkpoint is None:  # a checkpoint holds the second phase's weights: the first is not run again
            phase = training_arguments(f"{output_dir}-dense-phase", replace(size, steps=dense_steps), seed, args)
            start = time.perf_counter()
            ForecastTrainer(model=model, args=phase, train_dataset=train).train()
            dense_seconds = time.perf_counter() - start
        size = replace(size, steps=size.steps - dense_steps)
    packed = None
    if prepare is not None:
        packed = prepare(model, rank if schedule_at is None else None)
    elif method is not None:
        per_module = rank if isinstance(rank, dict) and schedule_at is None else {}
        apply_compression(
            model, CompressionConfig(method=method, rank=1.0 if isinstance(rank, dict) else rank, ranks=per_module)
        )
    training = training_arguments(output_dir, size, seed, args)
    distill = {} if teacher is None else {"teacher": teacher, "distill_weight": args.distill}
    if search is not None:
        trainer = ForecastSmartformerTrainer(
            model=model, args=training, train_dataset=train, eval_dataset=validation, search=search, **distill
        )
    else:
        trainer = ForecastTrainer(model=model, args=training, train_dataset=train, **distill)
    schedule = None
    if schedule_at is not None:
        schedule = RankSchedule(trainer, schedule_at, rank)
        trainer.add_callback(schedule)  # before model selection: a check at the switch step sees the new shapes
    final_shape = None if schedule is None else (lambda: schedule.done)
    average = None
    if args.weight_average is not None:  # before model selection: a check judges this step's average
        average = WeightAverage(trainer, args.weight_average, final_shape)
        trainer.add_callback(average)
    selection = None
    if not args.keep_last:
        selection = BestValidation(trainer, validation, size.validate_every, size.batch_size, final_shape, average)
        trainer.add_callback(selection)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start + dense_seconds
    model = trainer.model
    ranks, factor_bits, shared_from = {}, {}, {}
    if method is not None:
        ranks = {group.name: model.get_submodule(group.modules[0]).rank for group in attention_groups(model)}
    elif getattr(model.config, "compression_config", None):  # every Linear of its own: its rank and width
        specs = model.config.compression_config["modules"]
        ranks = {name: spec["rank"] for name, spec in specs.items() if "rank" in spec}
        factor_bits = {name: spec.get("factor_bits", spec.get("bits")) for name, spec in specs.items()}
        shared_from = {name: spec["source"] for name, spec in specs.items() if spec["type"] == "shared"}
    counts = byte_counts(model, packed)
    if full_model is not None:
        counts = against_full_model(counts, full_model)
    result = {
        "name": name,
        "seed": seed,
        "metrics": evaluate_forecaster(model, test, batch_size=size.batch_size, progress=False),
        "validation_mse": None if selection is None or selection.best is None else selection.best[0],
        "steps": size.steps + (dense_steps or 0),
        "dense_steps": dense_steps,
        "selected_step": (dense_steps or 0)
        + (size.steps if selection is None or selection.best is None else selection.best[1]),
        "params": sum(p.numel() for p in model.parameters()),
        "attention_params": attention_params(model),
        "d_model": model.config.d_model,
        "encoder_layers": model.config.num_hidden_layers,
        "ffn_dim": getattr(model.config, "ffn_dim", None) or model.config.encoder_ffn_dim,
        **counts,
        "flops": projection_flops(model),
        "model_flops": model_flops(model, test),
        "ranks": ranks,
        "factor_bits": factor_bits,
        "shared_from": shared_from,
        "agent_seed": None if search is None else search.seed,
        "switch_step": switch_at,
        "distill_weight": None if teacher is None else args.distill,
        "weight_average": args.weight_average,
        "train_seconds": round(seconds, 2),
        "resumed_from": checkpoint and os.path.basename(checkpoint),
    }
    if PartialState().num_processes > 1:  # what every process holds (the search decides on one and broadcasts)
        result["ranks_per_process"] = gather_object([ranks])
    return result, trainer


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
