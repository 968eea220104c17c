"""``SmartformerTrainer``: a ``transformers.Trainer`` that runs the Smartformer rank search while it trains.

At the end of every stage (``SearchConfig.interval`` optimizer steps or epochs) the main process advances the
MDP (``search.RankSearch``) and broadcasts the decision; every process then changes the chosen attention layer's
rank with ``set_rank``, swaps the new factors into the *same* optimizer (so the LR scheduler bound to it stays
valid), re-records the compression config, and, under DDP, rebuilds the wrapper (DDP registers gradient hooks
on the parameters it saw at construction, so new factors would otherwise never be all-reduced).
The search state is written into every checkpoint and read back by ``train(resume_from_checkpoint=...)``.

Under DDP with gradient accumulation the training loop's ``no_sync`` still targets the wrapper it made at the
start, so after a rebuild gradients are all-reduced at every micro-batch: correct, only more communication.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from ..compress import refresh_compression_config
from ..core.metrics import linear_bytes
from ..runtime.structure import install_layers
from .allocators import check_budget_fits
from .config import GREEDY_START, SearchConfig
from .form_swap import (
    change_forms,
    finish_forms,
    form_module,
    load_latents,
    prepare_for_forms,
    record_forms,
    save_latents,
    set_linear,
    swap_parameters,
)
from .forms import Form, linear_slots, start_form
from .mdp import STATE_FILE, RankSearch
from .optim import replace_parameters_in_optimizer
from .plot import plot_trace
from .space import Width, attention_groups, current_bits, current_rank

logger = logging.get_logger(__name__)


def apply_ranks(trainer: Trainer, ranks: dict[str, int], als_iterations: int) -> None:
    """Re-decompose each module of ``ranks`` ({module name: rank}) in the middle of ``trainer.train`` and keep its
    optimizer, scheduler, compression config and DDP wrapper valid."""
    if not ranks:
        return
    replaced: dict[nn.Parameter, nn.Parameter] = {}
    for name, rank in ranks.items():
        replaced.update(trainer.model.get_submodule(name).set_rank(rank, n_iter=als_iterations))
    if trainer.optimizer is not None:
        # the accelerate wrapper forwards param_groups/state to the torch optimizer; the scheduler holds
        # the same optimizer object, so it keeps stepping the learning rate of the new factors too
        replace_parameters_in_optimizer(getattr(trainer.optimizer, "optimizer", trainer.optimizer), replaced)
    refresh_compression_config(trainer.model)
    _rewrap_ddp(trainer)


def _rewrap_ddp(trainer: Trainer) -> None:
    old = trainer.model_wrapped
    if not isinstance(old, DistributedDataParallel):
        return
    handler = getattr(trainer.accelerator, "ddp_handler", None)
    kwargs = handler.to_kwargs() if handler is not None else {}
    new = DistributedDataParallel(trainer.model, device_ids=old.device_ids, output_device=old.output_device, **kwargs)
    if handler is not None:
        handler.register_comm_hook(new)
    models = trainer.accelerator._models  # accelerate's registry of prepared models (used by save_state etc.)
    for index, model in enumerate(models):
        if model is old:
            models[index] = new
    trainer.model_wrapped = new


class SmartformerCallback(TrainerCallback):
    """Feeds the search at the points of the training loop it needs: before the optimizer step (complete,
    synchronized gradients for the Taylor importance) and at each stage end (after the step, before saving)."""

    def __init__(self, trainer: SmartformerTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        config = self.trainer.search_config
        check_warmup(config, state.max_steps if config.interval_unit == "steps" else state.num_train_epochs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._accumulate_importance()

    def on_step_end(self, args, state, control, **kwargs):
        config = self.trainer.search_config
        after = state.global_step - config.warmup
        if config.interval_unit == "steps" and after > 0 and after % config.interval == 0:
            self.trainer._end_stage()

    def on_epoch_end(self, args, state, control, **kwargs):
        config = self.trainer.search_config
        after = round(state.epoch) - config.warmup
        if config.interval_unit == "epochs" and after > 0 and after % config.interval == 0:
            self.trainer._end_stage()

    def on_train_end(self, args, state, control, **kwargs):
        search = self.trainer.search
        if self.trainer.search_config.forms is not None:
            finish_forms(self.trainer.model, search.groups, search.chosen)
        if not search.done and self.trainer.is_world_process_zero():
            logger.warning(unfinished_search(search))
        self.trainer._write_plot()


def unfinished_search(search: RankSearch) -> str:
    """What a run that ended inside the search leaves: in the first pass undecided layers outside the budget's
    guarantee, in a later one every layer in a form an earlier pass gave it, within the budget."""
    undecided = [group.name for group in search.groups if group.name not in search.decided]
    if search.episode > 0:
        return (
            f"training ended in the search's pass {search.episode + 1} of {search.config.episodes}, before it took up "
            f"{undecided} again (they keep the forms an earlier pass gave them, within the budget); train longer for "
            "every pass, or lower SearchConfig.episodes"
        )
    return (
        f"training ended before the rank search decided {undecided} (they keep their current ranks, and a "
        "param_budget is only guaranteed once every layer is decided); train longer or shorten "
        "SearchConfig.interval / consecutive_actions / max_actions_per_layer / episodes"
    )


def check_warmup(config: SearchConfig, length: float | None) -> None:
    """Raise where ``warmup`` leaves the search no stage in a run of ``length`` steps or epochs (unknown: 0/None)."""
    if length and length > 0 and config.warmup >= length:
        raise ValueError(
            f"SearchConfig(warmup={config.warmup}) is not before the run's last of {length} {config.interval_unit}: "
            "the search would never act; lower warmup or train longer"
        )


def _low_bit(layer: nn.Module, spec: dict) -> bool:
    """A trainable low-rank layer that has, or is to get, low-bit factors."""
    bits = spec.get("factor_bits") is not None or getattr(layer, "factor_bits", None) is not None
    return bits and hasattr(layer, "set_factor_bits") and not getattr(layer, "stored", False)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class SmartformerTrainer(Trainer):
    """``Trainer`` plus the Smartformer search. The model must already be compressed with ``cp`` or ``svd``; for the
    search over forms (``SearchConfig(forms=...)``) it is dense, and every searched Linear starts in
    ``SearchConfig.start`` (dense by default).

    Args:
        *args: the positional arguments of ``transformers.Trainer``.
        search: the ``SearchConfig`` (defaults: a stage of 10 optimizer steps, loss reward with ε = 1.125).
        **kwargs: the keyword arguments of ``transformers.Trainer``.

    After training: ``search.ranks`` / ``search.decided`` hold the chosen ranks, ``search.trace`` every stage's
    record, ``rank_history`` the ranks this process held after each stage, ``search_seconds`` the time spent in
    the agent, in re-decomposition and in importance accumulation.
    """

    def __init__(self, *args, search: SearchConfig | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.search_config = search if search is not None else SearchConfig()
        self.search_config.validate()
        config = self.search_config
        check_warmup(config, self.args.max_steps if config.interval_unit == "steps" else self.args.num_train_epochs)
        if self.search_config.reward == "validation_loss" and self.eval_dataset is None:
            raise ValueError(
                "SearchConfig(reward='validation_loss') scores each stage on held-out batches: pass "
                "eval_dataset=... to the trainer, or use reward='loss'"
            )
        if config.forms is not None:
            options = {
                "front_only=True": config.front_only,
                f"share_by={config.share_by!r}": config.share_by == "sensitivity",
                f"start={config.start!r}": config.start == GREEDY_START,
                f"reward_baseline={config.reward_baseline!r}": config.reward_baseline == "same_weights",
            }
            measured = [option for option, given in options.items() if given]
            if measured and self.eval_dataset is None:
                raise ValueError(f"SearchConfig({', '.join(measured)}) scores each form on eval_dataset; pass one")
            slots = linear_slots(self.model, config)
            if config.byte_budget is not None:
                check_budget_fits(slots, config.byte_budget)  # before the model changes
            start = start_form(slots, config.start)  # checked before the model changes
            prepare_for_forms(self.model, slots, config.shared)
            change_forms(self.model, {slot.name: slot for slot in slots}, {slot.name: start for slot in slots})
            self.search = RankSearch(slots, {}, config, chosen={slot.name: start for slot in slots})
            record_forms(self.model, slots, self.search.chosen)
            if measured:
                self.search.measure = self._measure_forms
        else:
            groups = attention_groups(self.model, config.max_candidates, config.widths, config.factor_group_size)
            ranks = {group.name: current_rank(self.model, group) for group in groups}
            bits = {group.name: current_bits(self.model, group) for group in groups}
            self.search = RankSearch(groups, ranks, self.search_config, bits)
        self.rank_history: list[tuple[int, dict[str, int]]] = []
        self.search_seconds = {"agent": 0.0, "redecompose": 0.0, "importance": 0.0}
        self._stage_metric: torch.Tensor | None = None
        self.add_callback(SmartformerCallback(self))

    # ------------------------------------------------------------------ observing training
    def training_step(self, model: nn.Module, inputs: dict, num_items_in_batch=None) -> torch.Tensor:
        # The training loop keeps its own reference to the model it wrapped at the start; after a rank change
        # under DDP the current wrapper is ``self.model_wrapped`` (the underlying module is the same object).
        loss = super().training_step(self.model_wrapped, inputs, num_items_in_batch)
        if self._searching() and self.search_config.reward == "loss":
            self._add_metric(loss.detach().float())
        return loss

    def _searching(self) -> bool:
        """Whether the search is under way: past ``warmup`` (the step or epoch now running counts) and not done."""
        config = self.search_config
        now = self.state.global_step if config.interval_unit == "steps" else int(self.state.epoch)
        return not self.search.done and now >= config.warmup

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if (
            self.search_config.reward != "accuracy"
            or not self._searching()
            or not model.training
            or "labels" not in inputs
        ):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs["labels"]
        loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
        logits = next(outputs[key] for key in ("logits", "prediction_logits") if key in outputs)
        self._add_metric((logits.detach().argmax(-1) == labels).float().mean())
        return (loss, outputs) if return_outputs else loss

    def _add_metric(self, value: torch.Tensor) -> None:
        pair = torch.stack([value.reshape(()).float(), torch.ones((), device=value.device)])
        self._stage_metric = pair if self._stage_metric is None else self._stage_metric + pair

    def _accumulate_importance(self) -> None:
        if not self._searching() or not self.is_world_process_zero():
            return
        start = time.perf_counter()
        self.search.importance.accumulate(self.model)
        self.search_seconds["importance"] += time.perf_counter() - start

    @torch.no_grad()
    def _validation_loss(self) -> float:
        """Mean training loss (``compute_loss``) of the first ``validation_batches`` batches of ``eval_dataset``,
        in eval mode: the same windows at every stage end, so two stages differ only by what training did."""
        loader = torch.utils.data.DataLoader(
            self.eval_dataset, batch_size=self.args.per_device_eval_batch_size, collate_fn=self.data_collator
        )
        was_training = self.model.training
        self.model.eval()
        losses = []
        for index, batch in enumerate(loader):
            if index == self.search_config.validation_batches:
                break
            losses.append(float(self.compute_loss(self.model, self._prepare_inputs(batch))))
        self.model.train(was_training)
        return sum(losses) / max(len(losses), 1)

    def _global_stage_metric(self) -> tuple[float, int]:
        """Sum and count of this stage's metric over all processes (and over a resumed stage's first part)."""
        pair = self._stage_metric if self._stage_metric is not None else torch.zeros(2, device=self.args.device)
        pair = pair.to(self.args.device)
        if _distributed():
            dist.all_reduce(pair)
        self._stage_metric = None
        total, count = pair.tolist()
        total, count = total + self.search.metric_sum, int(count) + self.search.metric_count
        self.search.metric_sum, self.search.metric_count = 0.0, 0
        return total, count

    # ------------------------------------------------------------------ acting
    def _end_stage(self) -> None:
        if self.search.done:
            return
        total, count = self._global_stage_metric()
        record = None
        if self.is_world_process_zero():
            start = time.perf_counter()
            metric = (
                self._validation_loss() if self.search_config.reward == "validation_loss" else total / max(count, 1)
            )
            baseline = self._previous_form_loss() if self.search_config.reward_baseline == "same_weights" else None
            record = self.search.end_stage(self.state.global_step, metric, baseline)
            self.search_seconds["agent"] += time.perf_counter() - start
        if _distributed():
            payload = [record]
            dist.broadcast_object_list(payload, src=0)
            record = payload[0]
            if not self.is_world_process_zero():
                self.search.mirror(record)
        start = time.perf_counter()
        self._apply_ranks(record["changes"], record.get("bit_changes", {}))
        self._apply_forms({name: Form.parse(value) for name, value in record.get("form_changes", {}).items()})
        self.search_seconds["redecompose"] += time.perf_counter() - start
        record.update(self._searched_size())
        self.rank_history.append((self.state.global_step, dict(record["ranks"])))
        self._log_decision(record)

    def _searched_size(self) -> dict:
        """Parameters and bytes (on disk, in RAM, fp32 dense) of the searched modules at their current ranks."""
        names = [name for group in self.search.groups for name in group.modules]
        rows = linear_bytes(self.model)["modules"]
        return {
            "attention_params": sum(p.numel() for name in names for p in self.model.get_submodule(name).parameters()),
            "attention_bytes": {key: sum(rows[name][key] for name in names) for key in ("dense", "disk", "ram")},
        }

    def _apply_ranks(self, changes: dict[str, int], bit_changes: dict[str, Width]) -> None:
        """Ranks first (new factors swapped into the optimizer), then the factor widths: the same parameters,
        computed with from now on rounded to the new width (straight-through)."""
        modules = {name: rank for group, rank in changes.items() for name in self.search.by_name[group].modules}
        apply_ranks(self, modules, self.search_config.als_iterations)
        for group, bits in bit_changes.items():
            for name in self.search.by_name[group].modules:
                self.model.get_submodule(name).set_factor_bits(bits, self.search_config.factor_group_size)
        if bit_changes:
            refresh_compression_config(self.model)

    @torch.no_grad()
    def _measure_forms(self, name: str) -> dict[Form, float]:
        """The loss increase (``_validation_loss``) of the model with Linear ``name`` alone in each of its forms, built
        from the weights it has now, untrained; the model is left as it was."""
        base, chosen = self._validation_loss(), self.search.chosen[name]
        return {
            form: 0.0 if form == chosen else self._loss_in_form(name, form) - base
            for form in self.search.by_name[name].actions
        }

    def _previous_form_loss(self) -> float | None:
        """``reward_baseline="same_weights"``: ``_validation_loss`` with the Linear the agent last changed put back in
        its previous form; ``None`` where nothing is pending or its form did not change."""
        pending = self.search.pending
        if pending is None:
            return None
        name = pending["group"]
        previous = self.search.by_name[name].parse(pending["previous"])
        return None if previous == self.search.chosen[name] else self._loss_in_form(name, previous)

    @torch.no_grad()
    def _loss_in_form(self, name: str, form: Form) -> float:
        """``_validation_loss`` with Linear ``name`` in ``form``, built from the weights it has now, untrained; the
        model is left as it was."""
        slot, module = self.search.by_name[name], self.model.get_submodule(name)
        set_linear(self.model, name, form_module(self.model, slot, module, form))
        loss = self._validation_loss()
        set_linear(self.model, name, module)
        return loss

    def _apply_forms(self, forms: dict[str, Form]) -> None:
        """The search over forms: each Linear of ``forms`` takes its new form; the optimizer, the DDP wrapper and
        ``compression_config`` follow."""
        if not forms:
            return
        removed = change_forms(self.model, self.search.by_name, forms)
        if self.optimizer is not None:
            swap_parameters(getattr(self.optimizer, "optimizer", self.optimizer), self.model, removed)
        record_forms(self.model, self.search.groups, self.search.chosen)
        _rewrap_ddp(self)

    # ------------------------------------------------------------------ visibility
    def _log_decision(self, record: dict) -> None:
        logs = {"search/loss" if self.search_config.reward == "loss" else "search/accuracy": record["metric"]}
        for key in (
            "layer",
            "layer_importance",
            "rank",
            "previous_rank",
            "bits_chosen",
            "reward",
            "epsilon",
            "decided_layer",
        ):
            if key in record:
                logs[f"search/{key}"] = record[key]
        logs["search/attention_rank_sum"] = sum(record["ranks"].values())
        self.log(logs)
        if self.is_world_process_zero() and self.search_config.trace_file:
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(
                os.path.join(self.args.output_dir, self.search_config.trace_file), "w", encoding="utf-8"
            ) as handle:
                json.dump(self.search.trace, handle, indent=1)

    def _write_plot(self) -> None:
        if self.is_world_process_zero() and self.search_config.plot_file and self.search.trace:
            os.makedirs(self.args.output_dir, exist_ok=True)
            plot_trace(self.search.trace, os.path.join(self.args.output_dir, self.search_config.plot_file))

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        # a checkpoint inside a stage keeps the stage's metric so far: all processes' sums go to the main one
        total, count = self._global_stage_metric()
        if self.is_world_process_zero():
            self.search.metric_sum, self.search.metric_count = total, count
        if self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            self.search.save(folder)
            save_latents(self.model, folder)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Rebuild the model at the checkpoint's ranks (or forms), then load its weights and the search state."""
        if self.search_config.forms is not None:
            self._resume_forms(resume_from_checkpoint, model)
            return
        target = model if model is not None else self.model
        with open(os.path.join(resume_from_checkpoint, "config.json"), encoding="utf-8") as handle:
            saved = json.load(handle).get("compression_config") or {}
        current = target.config.compression_config["modules"]
        changed = {name: spec for name, spec in saved.get("modules", {}).items() if current.get(name) != spec}
        # a layer with low-bit factors keeps its trainable form (from a spec with factor_bits it would load stored)
        trainable = {name: spec for name, spec in changed.items() if _low_bit(target.get_submodule(name), spec)}
        for name, spec in trainable.items():
            layer = target.get_submodule(name)
            layer.set_rank(spec["rank"])
            layer.set_factor_bits(spec.get("factor_bits"), spec.get("factor_group_size"))
        install_layers(target, {name: spec for name, spec in changed.items() if name not in trainable})
        refresh_compression_config(target)
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_latents(target, resume_from_checkpoint)
        if os.path.exists(os.path.join(resume_from_checkpoint, STATE_FILE)):
            self.search.load(resume_from_checkpoint)
            if not self.is_world_process_zero():  # the stage's metric so far is counted once, on the main process
                self.search.metric_sum, self.search.metric_count = 0.0, 0

    def _resume_forms(self, resume_from_checkpoint: str, model: nn.Module | None) -> None:
        """The search over forms: the search state first (every Linear's form), the layers built in those forms,
        then the checkpoint's weights into them, the low-bit ones' fp32 weights last."""
        self.search.load(resume_from_checkpoint)
        if not self.is_world_process_zero():
            self.search.metric_sum, self.search.metric_count = 0.0, 0
        target = model if model is not None else self.model
        change_forms(target, self.search.by_name, dict(self.search.chosen))
        record_forms(target, self.search.groups, self.search.chosen)
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_latents(target, resume_from_checkpoint)
