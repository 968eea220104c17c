"""SmartformerTrainer: decisions during training, optimizer/scheduler kept valid, logging, checkpoint resume."""

from __future__ import annotations

import json
import os

import pytest
import torch
from smartformer_fixtures import appliances, sines, tiny_patchtst
from transformers import TrainerCallback, TrainingArguments

from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.trainer import SmartformerTrainer


def _args(output_dir, **kwargs) -> TrainingArguments:
    defaults = dict(
        max_steps=40,
        per_device_train_batch_size=16,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        report_to=[],
        logging_steps=10,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    defaults.update(kwargs)
    return TrainingArguments(str(output_dir), **defaults)


class FactorProbe(TrainerCallback):
    """Remembers, right after each rank change, the new factor tensors (values and identity)."""

    def __init__(self, trainer):
        self.trainer, self.snapshots = trainer, []

    def on_step_end(self, args, state, control, **kwargs):
        trace = self.trainer.search.trace
        if trace and trace[-1]["step"] == state.global_step and trace[-1]["changes"]:
            name = self.trainer.search.by_name[next(iter(trace[-1]["changes"]))].modules[0]
            layer = self.trainer.model.get_submodule(name)
            self.snapshots.append((state.global_step, name, [(p, p.detach().clone()) for p in layer.factors]))


def test_search_changes_ranks_and_the_optimizer_trains_the_new_factors(tmp_path):
    model = tiny_patchtst(layers=2)
    search = SearchConfig(interval=3, consecutive_actions=2, max_actions_per_layer=4, param_budget=0.45, seed=1)
    trainer = SmartformerTrainer(
        model=model, args=_args(tmp_path, max_steps=45), train_dataset=appliances(), search=search
    )
    probe = FactorProbe(trainer)
    trainer.add_callback(probe)
    trainer.train()

    assert trainer.search.done and probe.snapshots, "the search must finish and change at least one rank"
    optimizer = trainer.optimizer.optimizer
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}
    step, name, factors = probe.snapshots[-1]
    assert step < 45 and all(p is q for (p, _), q in zip(factors, model.get_submodule(name).factors))
    for param, at_change in factors:  # the factors made by the last rank change were trained afterwards
        assert not torch.equal(param.detach(), at_change)
        assert optimizer.state[param]["step"] == 45 - step
    # the scheduler still drives the same optimizer: linear decay reached 0 at max_steps for every group
    assert getattr(trainer.lr_scheduler.optimizer, "optimizer", None) is optimizer
    assert all(group["lr"] == 0.0 for group in optimizer.param_groups)

    budget = 0.45 * sum(g.dense_params for g in trainer.search.groups)
    assert budget >= sum(
        p.numel() for g in trainer.search.groups for m in g.modules for p in model.get_submodule(m).parameters()
    )
    recorded = model.config.compression_config["modules"]
    for group in trainer.search.groups:
        assert {recorded[m]["rank"] for m in group.modules} == {trainer.search.ranks[group.name]}


def test_decisions_are_logged_traced_and_plotted(tmp_path):
    model = tiny_patchtst(layers=2)
    search = SearchConfig(interval=4, consecutive_actions=2, max_actions_per_layer=3)
    trainer = SmartformerTrainer(model=model, args=_args(tmp_path, max_steps=32), train_dataset=sines(), search=search)
    trainer.train()
    decisions = [entry for entry in trainer.state.log_history if "search/loss" in entry]
    assert [entry["step"] for entry in decisions] == [record["step"] for record in trainer.search.trace]
    acted = [entry for entry in decisions if "search/layer" in entry]
    assert acted and all({"search/layer_importance", "search/rank", "search/epsilon"} <= set(e) for e in acted)
    assert all("search/reward" in entry for entry in decisions[1:])
    trace = json.loads((tmp_path / "smartformer_trace.json").read_text())
    assert trace == json.loads(json.dumps(trainer.search.trace))
    assert (tmp_path / "smartformer_trace.png").stat().st_size > 10_000
    for record in trace:  # the searched modules' size after each stage: parameters and bytes (fp32 factors)
        size = record["attention_bytes"]
        assert size["disk"] == size["ram"] == 4 * record["attention_params"] and size["dense"] > 0
    sizes = [record["attention_params"] for record in trace]
    assert sizes[-1] == sum(
        p.numel()
        for group in trainer.search.groups
        for name in group.modules
        for p in model.get_submodule(name).parameters()
    )


def test_epoch_stages_and_accuracy_reward_with_svd(tmp_path):
    from transformers import PatchTSTConfig, PatchTSTForClassification

    from hf_tensorcompress import CompressionConfig, apply_compression

    torch.manual_seed(0)
    config = PatchTSTConfig(
        num_input_channels=2,
        context_length=16,
        patch_length=4,
        patch_stride=4,
        d_model=16,
        num_attention_heads=4,
        num_hidden_layers=1,
        ffn_dim=16,
        num_targets=2,
    )
    model = apply_compression(PatchTSTForClassification(config), CompressionConfig(method="svd", rank=1.0))
    series = torch.randn(64, 16, 2)
    labels = (series[:, :, 0].mean(1) > 0).long()
    data = [{"past_values": x, "target_values": y} for x, y in zip(series, labels)]

    class Trainer(SmartformerTrainer):  # PatchTSTForClassification names its labels target_values
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs, labels=inputs["target_values"])
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    search = SearchConfig(
        interval=1, interval_unit="epochs", reward="accuracy", consecutive_actions=2, max_actions_per_layer=3
    )
    args = _args(tmp_path, max_steps=-1, num_train_epochs=4, label_names=["target_values"])
    trainer = Trainer(model=model, args=args, train_dataset=data, search=search)
    trainer.train()
    steps = [record["step"] for record in trainer.search.trace]
    assert (
        trainer.search.done and len(steps) >= 3 and steps == [4 * (i + 1) for i in range(len(steps))]
    )  # 4 steps/epoch
    assert all(0.0 <= record["metric"] <= 1.0 for record in trainer.search.trace)
    assert trainer.search.groups[0].layer_type == "svd"


def test_validation_loss_reward_scores_every_stage_on_the_same_held_out_batches(tmp_path):
    held_out = sines(seed=1)
    with pytest.raises(ValueError, match="eval_dataset"):
        SmartformerTrainer(
            model=tiny_patchtst(),
            args=_args(tmp_path),
            train_dataset=sines(),
            search=SearchConfig(reward="validation_loss"),
        )

    class Probe(TrainerCallback):  # the loss of the first 2 held-out batches, measured independently at each stage end
        def __init__(self):
            self.losses = {}

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 4 == 0 and not trainer.search.done:
                model = trainer.model.eval()
                with torch.no_grad():
                    losses = []
                    for start in (0, 8):
                        items = [held_out[i] for i in range(start, start + 8)]
                        batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
                        losses.append(float(model(**batch).loss))
                model.train()
                self.losses[state.global_step] = sum(losses) / 2

    search = SearchConfig(
        reward="validation_loss", validation_batches=2, interval=4, consecutive_actions=2, max_actions_per_layer=3
    )
    args = _args(tmp_path, max_steps=24, per_device_eval_batch_size=8)
    trainer = SmartformerTrainer(
        model=tiny_patchtst(), args=args, train_dataset=sines(), eval_dataset=held_out, search=search
    )
    probe = Probe()
    trainer.callback_handler.callbacks.insert(0, probe)  # before the search acts on the same step
    trainer.train()
    assert trainer.search.trace and all(
        record["metric"] == pytest.approx(probe.losses[record["step"]], rel=1e-5) for record in trainer.search.trace
    )
    assert len({record["metric"] for record in trainer.search.trace}) == len(trainer.search.trace)


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resume_after_the_first_decision_ends_with_the_same_ranks(tmp_path):
    def run(output_dir, stop=None, resume=None):
        model = tiny_patchtst(layers=2)
        search = SearchConfig(interval=3, consecutive_actions=2, max_actions_per_layer=4, param_budget=0.45, seed=5)
        args = _args(output_dir, max_steps=36, save_strategy="steps", save_steps=3)
        trainer = SmartformerTrainer(model=model, args=args, train_dataset=sines(), search=search)
        if stop is not None:
            trainer.add_callback(StopAt(stop))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    reference = run(tmp_path / "full")
    stopped = run(tmp_path / "stopped", stop=3)
    checkpoint = tmp_path / "stopped" / "checkpoint-3"
    first = stopped.search.trace[0]
    assert len(stopped.search.trace) == 1 and first["changes"], "the first decision changes a rank (budget wall)"
    saved = json.loads((checkpoint / "config.json").read_text())["compression_config"]["modules"]
    assert {saved[m]["rank"] for m in stopped.search.by_name[first["layer"]].modules} == {first["rank"]}

    resumed = run(tmp_path / "stopped", resume=str(checkpoint))
    assert resumed.search.ranks == reference.search.ranks and resumed.search.done
    strip = lambda trace: [(r["step"], r.get("layer"), r.get("rank"), r["ranks"]) for r in trace]  # noqa: E731
    assert strip(resumed.search.trace) == strip(reference.search.trace)
    for a, b in zip(resumed.search.trace, reference.search.trace):
        assert a["metric"] == pytest.approx(b["metric"], rel=1e-5)
    final = {name: p for name, p in resumed.model.named_parameters()}
    for name, param in reference.model.named_parameters():
        torch.testing.assert_close(final[name], param, rtol=1e-4, atol=1e-5)
    assert os.path.exists(checkpoint / "search_state.json") and os.path.exists(checkpoint / "search_agent.pt")
