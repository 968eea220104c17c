"""The graph each exported model family gets: a wrapper module with plain tensor inputs and outputs, example inputs,
dynamic dimensions and the metadata the runner reads.

- ``forecast`` (PatchTST for prediction, classification, regression): ``past_values`` → the model's main output;
- ``causal_lm`` (``lm.py``): ``input_ids`` + the KV cache → logits + the grown KV cache;
- ``forecast`` of Autoformer and Informer (``timeseries.py``): the time-series inputs → the forecast distribution's
  mean and parameters (Informer: teacher-forced, the runner feeds each step's mean back).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

#: The output field each PatchTST head returns its result in.
FORECAST_OUTPUTS = ("prediction_outputs", "prediction_logits", "regression_outputs")


class ForecastGraph(nn.Module):
    """``past_values`` (batch, context, channels) → the model's forecast (or class logits / regression values)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, past_values: torch.Tensor) -> torch.Tensor:
        output = self.model(past_values=past_values)
        return next(getattr(output, key) for key in FORECAST_OUTPUTS if getattr(output, key, None) is not None)


def forecast_graph(model: nn.Module) -> tuple[nn.Module, tuple, dict, dict]:
    config = model.config
    example = torch.randn(2, config.context_length, config.num_input_channels)
    dynamic = {"past_values": {0: torch.export.Dim("batch", min=1, max=4096)}}
    metadata = {
        "kind": "forecast",
        "architecture": type(model).__name__,
        "inputs": ["past_values"],
        "outputs": ["forecast"],
        "context_length": config.context_length,
        "num_input_channels": config.num_input_channels,
    }
    return ForecastGraph(model), (example,), dynamic, metadata


def _is_patchtst(model: nn.Module) -> bool:
    return getattr(model.config, "model_type", None) == "patchtst" and "Pretraining" not in type(model).__name__


def _is_causal_lm(model: nn.Module) -> bool:
    return any(cls.__name__.endswith("ForCausalLM") for cls in type(model).__mro__)


def _causal_lm_graph(model: nn.Module) -> tuple[nn.Module, tuple, dict, dict]:
    from .lm import causal_lm_graph

    return causal_lm_graph(model)


def _is_seq2seq_forecaster(model: nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in ("autoformer", "informer") and hasattr(model, "output_params")


def _distribution_graph(model: nn.Module) -> tuple[nn.Module, tuple, dict, dict]:
    from .timeseries import distribution_graph

    return distribution_graph(model)


#: family name → (does the model belong to it, the graph builder)
GRAPHS: dict[str, tuple[Callable[[nn.Module], bool], Callable]] = {
    "PatchTST (prediction, classification, regression)": (_is_patchtst, forecast_graph),
    "causal LMs (Llama-style, with a KV cache)": (_is_causal_lm, _causal_lm_graph),
    "Autoformer and Informer (for prediction)": (_is_seq2seq_forecaster, _distribution_graph),
}


def graph_for(model: nn.Module) -> Callable | None:
    """The graph builder for ``model``'s family, or None."""
    return next((build for accepts, build in GRAPHS.values() if accepts(model)), None)
