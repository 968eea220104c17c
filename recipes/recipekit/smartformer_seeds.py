"""One seed of the Smartformer recipe: every arm of the plan in order, the derived arms built from what this seed's
searches ended with, each run appended to ``results`` (and ``results.json``) as it finishes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import partial

from hf_tensorcompress.cli.checkpoint_size import weight_bytes
from hf_tensorcompress.core.metrics import compression_report
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.search.allocators import allocation_bytes, measure_form_sensitivity

from .byte_arms import BYTE_DERIVED, FirstWindows, byte_derived_arms
from .forecasters import Size
from .quantization_arms import PTQ_ARMS
from .run_headers import RunHeaders
from .smartformer_arms import DERIVED, Plan, derived_arms, search_end_step
from .smartformer_report import write_results
from .smartformer_runs import post_training_arm, reloaded, run_one


def validation_loss(validation, size: Size, batches: int):
    """The MSE of a model on the first ``batches`` batches of validation windows (what greedy-bytes measures)."""
    subset = FirstWindows(validation, batches * size.batch_size)
    return lambda model: evaluate_forecaster(
        model, subset, metrics=("mse",), batch_size=size.batch_size, progress=False
    )["mse"]


@dataclass
class SeedState:
    """What one seed's runs leave for the arms after them: the trained runs (``trained``: name -> (result,
    model)), the rank search's groups, ranks and end step (``searched``), the byte search's slots, final bytes, final
    forms and shares (``searched_bytes``), and the Smartformer model to save (the first seed's)."""

    trained: dict = field(default_factory=dict)
    searched: tuple | None = None
    searched_bytes: tuple | None = None
    smart: tuple | None = None
    trainer: object = None


def arm_runs(name: str, rank, plan: Plan, state: SeedState, seed: int, args, size: Size, data) -> list[tuple]:
    """(run name, rank, draw, prepare) of every run arm ``name`` makes for this seed."""
    arms = [(name, rank, None, plan.prepares.get(name))]
    if name in DERIVED:
        arms = [(*arm, None) for arm in derived_arms(name, *state.searched[:2], seed, args.random_draws)]
    if name in BYTE_DERIVED:
        slots, budget, searched, shared = state.searched_bytes
        dense = state.trained.get(plan.search_shape or "dense", (None, None))[1]
        loss = validation_loss(data[1], size, args.validation_batches)
        sensitivity = partial(measure_form_sensitivity, dense, slots, loss)
        made = byte_derived_arms(name, slots, budget, seed, args.random_draws, sensitivity, searched, shared)
        arms = [(run_name, None, draw, prepare) for run_name, draw, prepare, _ in made]
        for run_name, _, _, prepare in arms:
            if prepare is None:
                print(f"{run_name}: no allocation of one form everywhere fits {budget:,.0f} bytes; not run")
        arms = [arm for arm in arms if arm[3] is not None]
    return arms


def run_seed(seed: int, plan: Plan, args, size: Size, data, results: dict, headers: RunHeaders) -> SeedState:
    """Every arm of ``plan`` for ``seed``; returns what the seed's searches left."""
    state = SeedState()
    trainer = None
    for name, method, rank, make_search in plan.arms:
        if name in plan.post_arms:
            source, transform = plan.post_arms[name]
            folder = None if name in PTQ_ARMS else os.path.join(args.output_dir, "runs", f"{name}-seed{seed}")
            with headers.run(name):
                result = post_training_arm(name, *state.trained[source], transform, data, size, folder)
            results["runs"].append(result)
            print(json.dumps({k: result[k] for k in ("name", "seed", "metrics", "linear_bytes")}))
            continue
        switch_at = None
        if name.endswith("-scheduled"):
            switch_at = plan.switch_step if name in plan.prepares else state.searched[2]
        dense_steps = plan.dense_first.get(name)
        for run_name, run_rank, draw, prepare in arm_runs(name, rank, plan, state, seed, args, size, data):
            teacher = state.trained["dense"][1] if args.distill and name != "dense" else None
            with headers.run(run_name):
                search = make_search(seed) if make_search else None
                result, trainer = run_one(
                    run_name,
                    method,
                    run_rank,
                    search,
                    seed,
                    args,
                    size,
                    data,
                    switch_at,
                    prepare,
                    teacher,
                    dense_steps=dense_steps,
                    shape=plan.shapes.get(name),
                )
            state.trained[run_name] = (result, trainer.model)
            if draw is not None:
                result["draw"] = draw
            results["runs"].append(result)
            if name == "smartformer-bytes":
                searched_bytes(trainer, result, seed == args.seeds[0], args, size, data, state)
            if trainer.is_world_process_zero():
                shown = ("name", "seed", "metrics", "attention_params", "linear_bytes", "ranks", "factor_bits")
                print(json.dumps({k: result[k] for k in shown}))
                write_results(results, args.output_dir)
        if name == "smartformer":
            state.searched = (trainer.search.groups, dict(trainer.search.ranks), search_end_step(trainer.search.trace))
            if seed == args.seeds[0] and trainer.is_world_process_zero():
                state.smart = (trainer.model, trainer.args.output_dir)
    state.trainer = trainer
    return state


def searched_bytes(trainer, result: dict, first_seed: bool, args, size: Size, data, state: SeedState) -> None:
    """After the byte search: its slots and final bytes for the derived arms; its model saved with
    ``save_pretrained`` and loaded back, the loaded model's test MSE beside the trained one's (equal: every Linear is
    packed as it trained)."""
    found = trainer.search
    shared = trainer.search_config.shared
    state.searched_bytes = (found.groups, allocation_bytes(found.groups, found.chosen), dict(found.chosen), shared)
    result["forms"] = {slot.name: found.chosen[slot.name].label() for slot in found.groups}
    if not trainer.is_world_process_zero():
        return
    folder = os.path.join(
        args.output_dir, "smartformer-bytes-model" if first_seed else f"runs/bytes-model-{result['seed']}"
    )
    loaded = reloaded(trainer.model, folder)
    result["loaded_metrics"] = evaluate_forecaster(loaded, data[2], batch_size=size.batch_size, progress=False)
    result["loaded_bytes"] = loaded_bytes(loaded, folder)


def loaded_bytes(model, folder: str) -> dict:
    """What the searched model costs as a user gets it: every Linear and the whole model as loaded back (``disk``:
    what each stores, ``ram``: what it holds in memory once loaded, ``dense``: fp32), and the bytes of the
    checkpoint's weight files (the safetensors header included)."""
    report = compression_report(model)["bytes"]
    return {"linear": report["linear"], "model": report["model"], "weight_files": weight_bytes(folder)}
