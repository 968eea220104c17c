"""WeightAverage: the exponential moving average of a model's weights over the steps a Trainer takes, begun once the
architecture is final, judged and kept by BestValidation."""

from __future__ import annotations

import copy

import pytest
import torch
from smartformer_fixtures import dense_patchtst, quick_training_arguments, sines
from transformers import Trainer, TrainerCallback

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.evaluation.forecasting import evaluate_forecaster
from hf_tensorcompress.methods.lowbit.layer import LowBitLinear
from hf_tensorcompress.training.averaging import WeightAverage
from hf_tensorcompress.training.forecasting import BestValidation

DECAY = 0.8


def _trainer(tmp_path, max_steps: int = 8) -> Trainer:
    model = apply_compression(
        dense_patchtst(), CompressionConfig(method="lowbit", weight_bits="ternary", weight_group_size=8)
    )
    args = quick_training_arguments(tmp_path, max_steps, 5e-3)
    return Trainer(model=model, args=args, train_dataset=sines())


class WeightProbe(TrainerCallback):
    """Every parameter of the live model after each optimizer step."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.history = trainer, []

    def on_step_end(self, args, state, control, **kwargs):
        weights = {name: p.detach().clone() for name, p in self.trainer.model.named_parameters()}
        self.history.append((state.global_step, weights))


def _moving_average(history: list[tuple[int, dict]], first_step: int) -> dict[str, torch.Tensor]:
    averaged = None
    for step, weights in history:
        if step < first_step:
            continue
        if averaged is None:
            averaged = {name: value.clone() for name, value in weights.items()}
        else:
            averaged = {name: DECAY * averaged[name] + (1 - DECAY) * weights[name] for name in averaged}
    return averaged


def _stored(model: torch.nn.Module, parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict (as a low-bit layer stores it: codes and scales) of ``model`` holding ``parameters``."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(parameters[name])
    return model.state_dict()


def _assert_stored_alike(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6)


def test_the_model_ends_with_the_moving_average_of_its_low_bit_latent_weights(tmp_path):
    trainer = _trainer(tmp_path)
    probe = WeightProbe(trainer)
    trainer.add_callback(probe)
    average = WeightAverage(trainer, DECAY)
    trainer.add_callback(average)
    trainer.train()

    # the model stores what the average rounds to (a low-bit layer's state dict: its codes and scales)
    expected = _stored(trainer.model, _moving_average(probe.history, first_step=1))
    _assert_stored_alike(trainer.model.state_dict(), expected)
    last = _stored(trainer.model, probe.history[-1][1])
    assert any(not torch.equal(last[key], value) for key, value in expected.items())  # not the last step's
    assert isinstance(average.model().get_submodule("model.encoder.layers.0.self_attn.q_proj"), LowBitLinear)


def test_the_average_begins_again_once_the_architecture_is_final(tmp_path):
    trainer = _trainer(tmp_path)
    probe = WeightProbe(trainer)
    trainer.add_callback(probe)
    trainer.add_callback(WeightAverage(trainer, DECAY, architecture_final=lambda: trainer.state.global_step >= 5))
    trainer.train()

    expected = _stored(trainer.model, _moving_average(probe.history, first_step=5))  # steps 1-4 take no part
    _assert_stored_alike(trainer.model.state_dict(), expected)
    from_the_start = _stored(trainer.model, _moving_average(probe.history, first_step=1))
    assert any(not torch.equal(from_the_start[key], value) for key, value in expected.items())


def test_model_selection_judges_and_keeps_the_average(tmp_path):
    trainer = _trainer(tmp_path, max_steps=10)
    probe = WeightProbe(trainer)
    trainer.add_callback(probe)
    average = WeightAverage(trainer, DECAY)
    trainer.add_callback(average)
    validation = sines(seed=1)
    selection = BestValidation(trainer, validation, every=2, batch_size=16, average=average)
    trainer.add_callback(selection)
    trainer.train()

    mse, step, _ = selection.best
    kept = _stored(trainer.model, _moving_average(probe.history[:step], first_step=1))  # the average at that step
    _assert_stored_alike(trainer.model.state_dict(), kept)
    assert evaluate_forecaster(trainer.model, validation, batch_size=16, metrics=("mse",), progress=False)[
        "mse"
    ] == pytest.approx(mse)


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, True, "0.9"])
def test_a_decay_outside_zero_and_one_is_refused(tmp_path, decay):
    trainer = _trainer(tmp_path)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        WeightAverage(trainer, decay)
