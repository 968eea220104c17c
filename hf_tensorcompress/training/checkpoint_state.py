"""Trainer callbacks whose state travels in the Trainer's checkpoints, so that a resumed run ends where the
uninterrupted one did.

A ``Trainer`` checkpoint holds the model's ``state_dict``, the optimizer and the scheduler. It does not hold what a
callback keeps in memory (the best weights validation has seen, a moving average of the weights), nor the fp32
weights behind a low-bit layer's codes (its ``state_dict`` holds the codes, so a run resumed from them goes on from
rounded weights). ``CheckpointedCallback`` writes such state into each checkpoint folder and reads it back when a
run resumes from that folder.
"""

from __future__ import annotations

import logging
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..search.form_swap import latent_values, set_latent_values

logger = logging.getLogger(__name__)


class CheckpointedCallback(TrainerCallback):
    """A callback that saves ``checkpoint_state()`` as ``file`` in every checkpoint the Trainer writes, and gives it to
    ``restore(tensors, metadata, model)`` when training resumes at a step > 0.

    The state is read from ``<output_dir>/checkpoint-<step>``, where the Trainer wrote it and where
    ``resume_from_checkpoint=True`` resumes from; a resume from a folder elsewhere finds no state there and logs a
    warning that this callback starts afresh.
    """

    file: str

    def checkpoint_state(self, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The tensors and string metadata to save (both empty while there is nothing yet: the file still says so)."""
        raise NotImplementedError

    def restore(self, tensors: dict[str, torch.Tensor], metadata: dict[str, str], model: torch.nn.Module) -> None:
        raise NotImplementedError

    def on_save(self, args, state, control, model=None, **kwargs):
        if args.should_save:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if not os.path.isdir(folder):  # e.g. a hyperparameter search's trial, which saves under run-<trial>/
                logger.warning(
                    "no checkpoint folder %s: %s's state is not saved with this step", folder, type(self).__name__
                )
                return
            tensors, metadata = self.checkpoint_state(model)
            # no tensors with an empty metadata dict writes a header safetensors cannot read back: pass None
            save_file(tensors, os.path.join(folder, self.file), metadata=metadata or None)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            return
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", self.file)
        if not os.path.exists(path):
            logger.warning(
                "resuming at step %d without %s: %s starts afresh from this step (it finds its state only in a "
                "checkpoint the Trainer wrote into output_dir)",
                state.global_step,
                path,
                type(self).__name__,
            )
            return
        with safe_open(path, framework="pt") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
            metadata = handle.metadata() or {}
        self.restore(tensors, metadata, model)


class LatentCheckpoints(CheckpointedCallback):
    """Keeps the fp32 weights behind every coded parameter (a ``lowbit`` Linear's weight, low-bit factors) in the
    Trainer's checkpoints and restores them on resume, after the checkpoint's codes have loaded."""

    file = "latents.safetensors"

    def checkpoint_state(self, model):
        return latent_values(model), {}

    def restore(self, tensors, metadata, model):
        set_latent_values(model, tensors)
