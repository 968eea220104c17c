"""RankSchedule: fixed ranks set at one step of an ordinary Trainer run (the search's equal-size baselines on its
own schedule), with the optimizer, the recorded config and model selection following the cut."""

from __future__ import annotations

import pytest
import torch
from smartformer_fixtures import quick_training_arguments, sines, tiny_patchtst
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_tensorcompress.search import attention_groups
from hf_tensorcompress.search.schedule import RankSchedule
from hf_tensorcompress.training.forecasting import BestValidation


def _trainer(tmp_path, max_steps: int) -> Trainer:
    args = quick_training_arguments(tmp_path, max_steps, 2e-3)
    return Trainer(model=tiny_patchtst(layers=2), args=args, train_dataset=sines())


class RankProbe(TrainerCallback):
    """The rank of every attention projection after each optimizer step."""

    def __init__(self, model) -> None:
        self.model, self.history = model, []

    def on_step_end(self, args, state, control, **kwargs):
        modules = [m for g in attention_groups(self.model) for m in g.modules]
        self.history.append((state.global_step, {self.model.get_submodule(m).rank for m in modules}))


def test_ranks_change_at_the_step_and_the_new_factors_train_and_win_model_selection(tmp_path):
    trainer = _trainer(tmp_path, max_steps=12)
    model = trainer.model
    modules = [m for g in attention_groups(model) for m in g.modules]
    full = {model.get_submodule(m).rank for m in modules}
    schedule = RankSchedule(trainer, 5, {m: 2 for m in modules})
    trainer.add_callback(schedule)
    probe = RankProbe(model)
    trainer.add_callback(probe)
    selection = BestValidation(trainer, sines(seed=1), every=2, batch_size=16, final_shape=lambda: schedule.done)
    trainer.add_callback(selection)
    trainer.train()

    assert full != {2} and schedule.done
    assert [ranks for step, ranks in probe.history if step < 5] == [full] * 4
    assert all(ranks == {2} for step, ranks in probe.history if step >= 5)
    optimizer = trainer.optimizer.optimizer
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    for factor in model.get_submodule(modules[0]).factors:  # made at step 5, trained at steps 6..12
        assert optimizer.state[factor]["step"] == 12 - 5
    assert {model.config.compression_config["modules"][m]["rank"] for m in modules} == {2}
    # only weights of the final shape compete; the restored ones load into the rank-2 model
    assert selection.best[1] >= 6


def test_a_step_outside_the_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="after an optimizer step"):
        RankSchedule(_trainer(tmp_path, 4), 0, {})
    trainer = _trainer(tmp_path, max_steps=4)
    layer = trainer.model.get_submodule("model.encoder.layers.0.self_attn.q_proj")
    rank = layer.rank
    trainer.add_callback(RankSchedule(trainer, 9, {"model.encoder.layers.0.self_attn.q_proj": 2}))
    with pytest.raises(ValueError, match="after the run's last step"):
        trainer.train()
    assert layer.rank == rank and trainer.state.global_step == 0  # refused before anything trained or changed


def test_a_run_resumed_after_the_cut_starts_at_the_final_ranks_and_the_schedule_stays_done(tmp_path):
    def run(model, resume=None):
        args = TrainingArguments(
            str(tmp_path),
            max_steps=8,
            per_device_train_batch_size=16,
            learning_rate=2e-3,
            report_to=[],
            save_strategy="steps",
            save_steps=4,
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
            data_seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=sines())
        modules = [m for g in attention_groups(model) for m in g.modules]
        schedule = RankSchedule(trainer, 3, {m: 2 for m in modules})
        trainer.add_callback(schedule)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, schedule, modules

    uninterrupted, _, modules = run(tiny_patchtst(layers=2))
    final = tiny_patchtst(layers=2, rank=2)  # the checkpoint's shapes: the ranks after the cut at step 3
    resumed, schedule, _ = run(final, resume=str(tmp_path / "checkpoint-4"))
    assert schedule.done and resumed.state.global_step == 8
    assert {final.get_submodule(m).rank for m in modules} == {2}
    for name, param in uninterrupted.model.named_parameters():  # the same weights as the run that never stopped
        assert torch.allclose(param, dict(final.named_parameters())[name], atol=1e-5), name
