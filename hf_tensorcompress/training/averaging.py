"""An exponential moving average of a model's weights while a ``Trainer`` trains it, for the model to keep.

Low-bit weights trained quantization-aware flip between neighbouring levels from step to step (the latent weight
sits near a rounding threshold), so the weights at any one step carry that step's noise; the average of the latent
weights (and learned scales) over the last few hundred steps, rounded as the layer stores them, does not. torch's
``AveragedModel`` keeps the average; this callback feeds it and hands it to ``BestValidation`` to judge.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import Trainer

from .checkpoint_state import CheckpointedCallback


def search_done(trainer: Trainer) -> bool:
    """Whether ``trainer`` runs no search or its search has decided every layer: the layer forms are final."""
    search = getattr(trainer, "search", None)
    return search is None or search.done


class WeightAverage(CheckpointedCallback):
    """The exponential moving average of ``trainer.model``'s parameters with ``decay`` per optimizer step (buffers,
    e.g. BatchNorm's running statistics, follow the live model), begun at the first step at which
    ``architecture_final()`` holds (default: ``search_done``) and begun afresh whenever it does not (a search still
    changing layer forms).

    ``model()`` is the averaged model (the live one before the average begins); at the end of training the average
    is copied into ``trainer.model`` (``BestValidation`` given this average, added after it, then restores the best
    average it saw instead). The average travels in the Trainer's checkpoints (``CheckpointedCallback``, the fp32
    latents of low-bit layers rather than their codes): a resumed run goes on averaging where it stopped.
    """

    file = "weight_average.safetensors"

    def __init__(self, trainer: Trainer, decay: float, architecture_final: Callable[[], bool] | None = None) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise ValueError(
                f"decay={decay!r}: the weight a step keeps of the average, in (0, 1), e.g. 0.995 (about the last 200 "
                "steps)"
            )
        self.trainer, self.decay = trainer, float(decay)
        self.architecture_final = architecture_final or (lambda: search_done(trainer))
        self.averaged: AveragedModel | None = None
        self.resumed: dict[str, torch.Tensor] | None = None  # a checkpoint's average, for the first step after it

    def model(self) -> torch.nn.Module:
        return self.trainer.model if self.averaged is None else self.averaged.module

    def on_step_end(self, args, state, control, **kwargs):
        if not self.architecture_final():
            self.averaged = self.resumed = None
            return
        if self.averaged is None:
            self.averaged = AveragedModel(self.trainer.model, multi_avg_fn=get_ema_multi_avg_fn(self.decay))
            if self.resumed is not None:
                with torch.no_grad():
                    for name, value in self._tensors().items():
                        value.copy_(self.resumed[name])
        self.resumed = None
        self.averaged.update_parameters(self.trainer.model)

    def _tensors(self) -> dict[str, torch.Tensor]:
        """The average's parameters (fp32 latents, not a low-bit layer's codes), buffers and step count."""
        return {**dict(self.averaged.named_parameters()), **dict(self.averaged.named_buffers())}

    def checkpoint_state(self, model):
        if self.averaged is None:  # not begun yet
            return {}, {}
        return {name: value.detach().cpu().contiguous() for name, value in self._tensors().items()}, {}

    def restore(self, tensors, metadata, model):
        self.resumed = tensors or None

    def on_train_end(self, args, state, control, **kwargs):
        if self.averaged is not None:
            self.trainer.model.load_state_dict(self.averaged.module.state_dict())
