"""The Autoformer and Informer graphs: the time-series inputs in, the forecast distribution's mean (and its
parameters) out.

- Autoformer (``decoding: one_pass``): its decoder input is built from the context alone (seasonal and trend parts
  of the last ``label_length`` steps, then zeros and the context mean), so ONE forward gives the whole forecast
  distribution; the graph returns its mean, the exact point forecast ``evaluation.point_forecast`` computes.
- Informer (``decoding: mean_feedback``): its decoder reads the lagged target values, so a forecast is a loop over
  the horizon. The graph is the teacher-forced forward (``future_values`` in, every step's distribution out, each
  step seeing only the values before it); the runner loops in numpy, feeding back each step's MEAN
  (``evaluation.mean_feedback.mean_feedback_forecast`` is the PyTorch definition). ProbSparse attention
  (``attention_type="prob"``) draws the keys it scores at random on every call, so it is refused.
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import torch
from torch import nn

from .errors import OnnxExportError

#: Inputs every Autoformer/Informer graph takes, in order (the static features follow when the config has them).
TIME_INPUTS = ["past_values", "past_time_features", "past_observed_mask", "future_time_features"]


def _static_inputs(config) -> list[str]:
    names = ["static_categorical_features"] if config.num_static_categorical_features else []
    return names + (["static_real_features"] if config.num_static_real_features else [])


def _mask_as_given(*, attention_mask: torch.Tensor | None, **_: object) -> torch.Tensor | None:
    return attention_mask


def _eager_masks(model: nn.Module) -> contextlib.AbstractContextManager:
    """The all-visible masks as eager mode builds them: none. While exporting, transformers materialises each as a
    tensor of the input's length instead, which both families then misuse: Autoformer's auto-correlation reshapes its
    (time × channel) scores to (time × time) for it (and fails unless ``head_dim`` equals the length), Informer's
    distilling encoder halves the length after each layer and keeps adding the first layer's mask. (The decoder's
    causal mask is built per layer call, at the right length, and stays.)"""
    return mock.patch.object(sys.modules[type(model.model).__module__], "create_bidirectional_mask", _mask_as_given)


@contextlib.contextmanager
def _unchecked_distributions():
    """torch.distributions without argument checks while tracing: a check is a data-dependent ``if`` (``raise``
    unless every scale is positive), which torch.export cannot trace; the model's heads map to valid arguments."""
    checked = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(checked)


def _params(model: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``model.output_params(hidden)`` (on the last ``prediction_length`` steps: Autoformer's decoder also returns
    the ``label_length`` context steps), with a size-1 axis added before the head's ``squeeze(-1)`` when the target
    is multivariate: there torch's squeeze of the size-``input_size`` axis does nothing, but the exporter writes it
    as an ONNX ``Squeeze`` that ONNX Runtime refuses to load."""
    projection, hidden = model.parameter_projection, hidden[:, -model.config.prediction_length :]
    raw = [project(hidden) for project in projection.proj]
    if model.config.input_size > 1:
        raw = [part.unsqueeze(-1) for part in raw]
    return projection.domain_map(*raw)


class DistributionGraph(nn.Module):
    """``(past_values, past_time_features, past_observed_mask, future_time_features[, static features]
    [, future_values])`` → ``(forecast mean, distribution parameters…, scaler loc, scaler scale)``.

    Without a ``future_values`` input (Autoformer) the forward gets zeros in its place: Autoformer reads only their
    shape (its decoder input comes from the context)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        named = dict(zip(self.names, inputs))
        if "future_values" not in named:
            past = named["past_values"]
            named["future_values"] = past.new_zeros(past.shape[0], self.model.config.prediction_length, *past.shape[2:])
        with _eager_masks(self.model):
            output = self.model.model(**named, use_cache=False)
        trend = getattr(output, "trend", None)
        hidden = output.last_hidden_state if trend is None else output.last_hidden_state + trend
        params = _params(self.model, hidden)
        with _unchecked_distributions():
            mean = self.model.output_distribution(params, loc=output.loc, scale=output.scale).mean
        return (mean, *params, output.loc, output.scale)


def _shapes(config, batch: int) -> dict[str, tuple[int, ...]]:
    """Each input's shape (a univariate target has no channel axis)."""
    past, future, target = config.context_length + max(config.lags_sequence), config.prediction_length, ()
    if config.input_size > 1:
        target = (config.input_size,)
    return {
        "past_values": (batch, past, *target),
        "past_time_features": (batch, past, config.num_time_features),
        "past_observed_mask": (batch, past, *target),
        "future_time_features": (batch, future, config.num_time_features),
        "static_categorical_features": (batch, config.num_static_categorical_features),
        "static_real_features": (batch, config.num_static_real_features),
        "future_values": (batch, future, *target),
    }


def _example(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if name == "past_observed_mask":
        return torch.ones(shape)
    if name == "static_categorical_features":
        return torch.zeros(shape, dtype=torch.long)
    return torch.randn(shape)


def _refuse_random_or_peeking(model: nn.Module) -> None:
    config = model.config
    if getattr(config, "attention_type", "full") == "prob":
        raise OnnxExportError(
            'Informer with attention_type="prob" does not export: ProbSparse attention draws the keys it scores at '
            'random on every call (torch.randint), so no fixed graph gives its forecast; attention_type="full" exports'
        )
    if min(config.lags_sequence) < 1:
        raise OnnxExportError("lags_sequence holds a lag below 1: a decoder step would read its own target value")


def distribution_graph(model: nn.Module) -> tuple[nn.Module, tuple, dict, dict]:
    """The graph, example inputs, dynamic batch dimension and metadata of an Autoformer or Informer forecaster."""
    config = model.config
    feeds_back = config.model_type == "informer"
    if feeds_back:
        _refuse_random_or_peeking(model)
    names = TIME_INPUTS + _static_inputs(config) + (["future_values"] if feeds_back else [])
    shapes = _shapes(config, 2)
    batch = torch.export.Dim("batch", min=1, max=4096)
    params = list(model.distribution_output.args_dim)
    metadata = {
        "kind": "forecast",
        "architecture": type(model).__name__,
        "decoding": "mean_feedback" if feeds_back else "one_pass",
        "inputs": names,
        "outputs": ["forecast", *(f"distribution_{name}" for name in params), "scaler_loc", "scaler_scale"],
        "input_shapes": {name: [None, *shapes[name][1:]] for name in names},
        "prediction_length": config.prediction_length,
        "distribution": config.distribution_output,
    }
    example = tuple(_example(name, shapes[name]) for name in names)
    dynamic = {"inputs": tuple({0: batch} for _ in names)}
    return DistributionGraph(model, names), example, dynamic, metadata
