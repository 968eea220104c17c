"""Knowledge distillation in the forecasters' Trainers: the loss mixes the truth and the teacher's forecast, the
teacher is never trained, and a teacher that forecasts something else is refused before training."""

from __future__ import annotations

import pytest
import torch
from smartformer_fixtures import dense_patchtst, sines
from transformers import PatchTSTConfig, PatchTSTForPrediction, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.training.forecasting import ForecastSmartformerTrainer, ForecastTrainer


def arguments(tmp_path, steps: int = 4) -> TrainingArguments:
    return TrainingArguments(
        str(tmp_path), max_steps=steps, per_device_train_batch_size=8, report_to=[], use_cpu=True, save_strategy="no"
    )


def batch_of(windows, size: int = 8) -> dict[str, torch.Tensor]:
    return torch.utils.data.default_collate([windows[i] for i in range(size)])


def shifted(model: PatchTSTForPrediction) -> PatchTSTForPrediction:
    """``model`` with every weight moved: an untrained PatchTST forecasts about the context's level whatever its
    seed, so two seeds alone would forecast nearly the same."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    return model


def test_the_loss_mixes_the_truth_and_the_teachers_forecast(tmp_path):
    windows = sines()
    student, teacher = dense_patchtst(seed=0), shifted(dense_patchtst(seed=1))
    batch = batch_of(windows)
    trainer = ForecastTrainer(
        model=student, args=arguments(tmp_path), train_dataset=windows, teacher=teacher, distill_weight=0.25
    )
    with torch.no_grad():
        forecast = student(past_values=batch["past_values"]).prediction_outputs
        target = teacher.eval()(past_values=batch["past_values"]).prediction_outputs
        loss = trainer.compute_loss(student, batch)
    to_truth = (forecast - batch["future_values"]).square().mean()
    to_teacher = (forecast - target).square().mean()
    assert to_teacher > 0.01 and abs(to_truth - to_teacher) > 0.01  # the two terms differ: the mix is visible
    assert loss.item() == pytest.approx((0.75 * to_truth + 0.25 * to_teacher).item(), rel=1e-5)
    plain = ForecastTrainer(model=student, args=arguments(tmp_path), train_dataset=windows)
    with torch.no_grad():
        assert plain.compute_loss(student, batch).item() == pytest.approx(to_truth.item(), rel=1e-5)


def test_a_distilled_search_trains_and_leaves_the_teacher_as_it_was(tmp_path):
    windows = sines()
    teacher = dense_patchtst(seed=1).train()
    before = {name: value.clone() for name, value in teacher.state_dict().items()}
    student = apply_compression(dense_patchtst(seed=0), CompressionConfig(method="cp", rank=1.0))
    trainer = ForecastSmartformerTrainer(
        model=student,
        args=arguments(tmp_path, steps=6),
        train_dataset=windows,
        search=SearchConfig(interval=2, consecutive_actions=2, max_actions_per_layer=3, param_budget=0.5, seed=0),
        teacher=teacher,
        distill_weight=1.0,
    )
    trainer.train()
    assert all(torch.equal(value, before[name]) for name, value in teacher.state_dict().items())
    assert not teacher.training  # scored in eval mode: its dropout off
    assert "teacher" not in str(trainer.model.state_dict().keys())  # not part of the model: never saved with it
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def test_a_teacher_of_other_windows_or_a_bad_weight_is_refused(tmp_path):
    windows = sines()
    config = dense_patchtst().config.to_dict()
    config["prediction_length"] = 4
    other = PatchTSTForPrediction(PatchTSTConfig.from_dict(config))
    with pytest.raises(ValueError, match=r"config.prediction_length is 4 and the model's is 8"):
        ForecastTrainer(model=dense_patchtst(), args=arguments(tmp_path), train_dataset=windows, teacher=other)
    for weight in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
            ForecastTrainer(
                model=dense_patchtst(),
                args=arguments(tmp_path),
                train_dataset=windows,
                teacher=dense_patchtst(),
                distill_weight=weight,
            )
    with pytest.raises(TypeError, match="trained transformers forecaster"):
        ForecastTrainer(model=dense_patchtst(), args=arguments(tmp_path), train_dataset=windows, teacher="dense/")
