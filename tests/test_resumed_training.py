"""A quantization-aware forecaster run resumed from a Trainer checkpoint ends exactly where the uninterrupted run did:
the checkpoint keeps the fp32 weights behind the low-bit codes (and fp16-stored biases), the best weights validation
has seen, and the moving average of the weights."""

from __future__ import annotations

import logging
import shutil

import torch
from smartformer_fixtures import dense_patchtst, quick_training_arguments, sines
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.training.averaging import WeightAverage
from hf_tensorcompress.training.checkpoint_state import LatentCheckpoints
from hf_tensorcompress.training.forecasting import BestValidation, ForecastTrainer

STEPS = 8


class SelectionProbe(TrainerCallback):
    """``BestValidation``'s best (validation MSE, step) when training begins and after each step."""

    def __init__(self, selection: BestValidation) -> None:
        self.selection, self.seen = selection, {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen["begin"] = self.selection.best and self.selection.best[:2]

    def on_step_end(self, args, state, control, **kwargs):
        self.seen[state.global_step] = self.selection.best and self.selection.best[:2]


def _train(output_dir, resume: str | None = None, average: float | None = None, learning_rate: float = 0.1):
    """Eight steps of a ternary PatchTST with learned scales and fp16 biases, a checkpoint every 2 steps, model
    selection every 2 steps (on the moving average with ``average``)."""
    model = apply_compression(
        dense_patchtst(),
        CompressionConfig(
            method="lowbit", weight_bits="ternary", weight_group_size=8, weight_scales="learned", bias_dtype="float16"
        ),
    )
    args = quick_training_arguments(output_dir, STEPS, learning_rate, save_strategy="steps", save_steps=2)
    trainer = ForecastTrainer(model=model, args=args, train_dataset=sines())
    moving = None
    if average is not None:
        moving = WeightAverage(trainer, average)
        trainer.add_callback(moving)
    selection = BestValidation(trainer, sines(seed=1), every=2, batch_size=16, average=moving)
    trainer.add_callback(selection)
    probe = SelectionProbe(selection)
    trainer.add_callback(probe)
    trainer.train(resume_from_checkpoint=resume)
    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return weights, selection.best[:2], probe.seen


def _resume_in_a_fresh_folder(uninterrupted, step: int, folder):
    """A fresh output folder holding only the uninterrupted run's checkpoint at ``step`` (as after a crash)."""
    shutil.copytree(uninterrupted / f"checkpoint-{step}", folder / f"checkpoint-{step}")
    return str(folder / f"checkpoint-{step}")


def test_a_resumed_quantization_aware_run_keeps_its_latent_weights_and_the_best_validation_so_far(tmp_path, caplog):
    weights, best, seen = _train(tmp_path / "uninterrupted")
    with caplog.at_level(logging.WARNING, logger="hf_tensorcompress.training.checkpoint_state"):
        resumed_weights, resumed_best, resumed_seen = _train(
            tmp_path / "resumed", _resume_in_a_fresh_folder(tmp_path / "uninterrupted", 6, tmp_path / "resumed")
        )
    assert not [record for record in caplog.records if "starts afresh" in record.getMessage()]
    assert seen[6] is not None and resumed_seen["begin"] == seen[6]  # the best of steps 2, 4 and 6
    assert resumed_best == best
    assert all(torch.equal(resumed_weights[name], value) for name, value in weights.items())


def test_a_resumed_run_goes_on_with_the_moving_average_it_had(tmp_path):
    weights, best, _ = _train(tmp_path / "uninterrupted", average=0.8, learning_rate=5e-3)
    resumed_weights, resumed_best, _ = _train(
        tmp_path / "resumed",
        _resume_in_a_fresh_folder(tmp_path / "uninterrupted", 4, tmp_path / "resumed"),
        average=0.8,
        learning_rate=5e-3,
    )
    assert best[1] > 4  # the kept average is one the resumed run made, from the average it read back
    assert resumed_best == best
    assert all(torch.equal(resumed_weights[name], value) for name, value in weights.items())


def test_a_resume_from_a_folder_outside_output_dir_warns_that_the_state_starts_afresh(tmp_path, caplog):
    _train(tmp_path / "uninterrupted")
    elsewhere = tmp_path / "elsewhere" / "checkpoint-4"
    shutil.copytree(tmp_path / "uninterrupted" / "checkpoint-4", elsewhere)
    with caplog.at_level(logging.WARNING, logger="hf_tensorcompress.training.checkpoint_state"):
        _train(tmp_path / "other-output", str(elsewhere))
    warned = [record.getMessage() for record in caplog.records if "starts afresh" in record.getMessage()]
    assert any("LatentCheckpoints" in message for message in warned)
    assert any("BestValidation" in message for message in warned)


def test_a_step_without_its_checkpoint_folder_saves_nothing_and_warns(tmp_path, caplog):
    """A trainer that saves elsewhere (a hyperparameter search's trial folders) gets a warning, not a crash."""
    model = apply_compression(dense_patchtst(), CompressionConfig(method="lowbit", weight_bits="ternary"))
    args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True)
    state = TrainerState(global_step=4)
    with caplog.at_level(logging.WARNING, logger="hf_tensorcompress.training.checkpoint_state"):
        LatentCheckpoints().on_save(args, state, TrainerControl(), model=model)
    assert "LatentCheckpoints's state is not saved" in caplog.text
    assert not any(tmp_path.iterdir())
