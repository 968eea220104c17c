"""Forecasts in the user's units: the standardisation a forecaster was trained with, applied inside the graph.

The library's forecasters are trained on standardised values (``(x − mean) / std`` per channel, the training split's
statistics, which the recipes save as ``standardization.json`` beside the model and ``hf-tensorcompress compress``
copies along). An exported file that took and returned standardised values would give wrong forecasts for raw
values without an error, so the statistics go into the graph: the value inputs (``past_values``, Informer's
``future_values``) are standardised first and the forecast is returned in the inputs' units. The metadata says so
(``units``, and the statistics under ``standardization``); the distribution's parameters and the scaler's outputs
stay in the model's own units. A model without statistics is exported as it is, and the metadata says that too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from .errors import OnnxExportError

#: The file the statistics are read from, beside a model folder (what ``data/standardize.Standardization.to_json``
#: writes: one key, below).
STATISTICS_FILE = "standardization.json"
STATISTICS_KEY = "hf_tensorcompress.standardization"
#: Graph inputs that carry the forecast channels' values (the rest are masks, time features, static features).
VALUE_INPUTS = ("past_values", "future_values")
AS_TRAINED = (
    "the model's own: no standardization.json beside the model, so values go in and come out unchanged (feed what "
    "the model was trained on, or export with the statistics: export_onnx(..., standardization=PATH))"
)
YOURS = (
    "yours: the value inputs are standardised inside the graph with the training statistics under "
    "'standardization', and 'forecast' comes back in the inputs' units (the distribution's parameters and the "
    "scaler's outputs stay in the model's)"
)


def read_statistics(source: object, given: object = None) -> dict | None:
    """``{"columns", "mean", "std"}`` from ``given`` (a ``Standardization``, its dict, or the path of its JSON),
    else from ``standardization.json`` beside a model folder ``source``; None where there is none."""
    if given is None:
        if not isinstance(source, (str, os.PathLike)) or not (Path(source) / STATISTICS_FILE).is_file():
            return None
        given = Path(source) / STATISTICS_FILE
    if isinstance(given, (str, os.PathLike)):
        try:
            given = json.loads(Path(given).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise OnnxExportError(f"standardization {given}: not a readable statistics file ({error})") from None
    if isinstance(given, dict):
        given = given.get(STATISTICS_KEY, given)
        values = {key: given.get(key) for key in ("columns", "mean", "std")}
    else:
        values = {key: getattr(given, key, None) for key in ("columns", "mean", "std")}
    if not all(isinstance(v, (list, tuple)) for v in values.values()) or len({len(v) for v in values.values()}) != 1:
        raise OnnxExportError(
            "standardization: expected equally long lists 'columns', 'mean' and 'std' (what the recipes save as "
            "standardization.json)"
        )
    if not all(float(s) > 0 for s in values["std"]):
        raise OnnxExportError("standardization: every 'std' must be positive")
    return {key: list(value) for key, value in values.items()}


class InUserUnits(nn.Module):
    """A forecast graph that takes and returns values in the user's units: the ``scaled`` inputs standardised with
    ``mean`` and ``std`` (per channel, the last axis; one value for a univariate target), the first output (the
    forecast) mapped back."""

    def __init__(self, graph: nn.Module, mean: list[float], std: list[float], scaled: list[int]) -> None:
        super().__init__()
        self.forecaster, self.scaled = graph, scaled  # not ``graph``: torch.fx modules have an attribute of that name
        # not "mean" / "std": the exporter names graph nodes so, and an initializer may not share a node's name
        self.register_buffer("standardization_mean", torch.tensor(mean, dtype=torch.float32).reshape(-1).squeeze(0))
        self.register_buffer("standardization_std", torch.tensor(std, dtype=torch.float32).reshape(-1).squeeze(0))

    def forward(self, *inputs: torch.Tensor):
        mean, std = self.standardization_mean, self.standardization_std
        outputs = self.forecaster(*((x - mean) / std if i in self.scaled else x for i, x in enumerate(inputs)))
        if isinstance(outputs, torch.Tensor):
            return outputs * std + mean
        return (outputs[0] * std + mean, *outputs[1:])


def in_user_units(
    graph: nn.Module, model: nn.Module, metadata: dict, dynamic: dict, statistics: dict | None
) -> tuple[nn.Module, dict, dict]:
    """``graph`` wrapped by ``InUserUnits`` where there are statistics for a forecaster (with its dynamic dimensions
    given by position, as the wrapper takes its inputs), and the metadata saying in which units the file takes and
    gives values."""
    forecasts = metadata["kind"] == "forecast" and "ForPrediction" in metadata["architecture"]
    if statistics is None or not forecasts:
        if statistics is not None:
            raise OnnxExportError(
                f"standardization applies to forecasters; {metadata['architecture']} is not one: export it without"
            )
        return graph, dynamic, {**metadata, "units": AS_TRAINED} if forecasts else metadata
    config = model.config
    channels = getattr(config, "num_input_channels", None) or getattr(config, "input_size", None)
    if len(statistics["columns"]) != channels:
        raise OnnxExportError(
            f"standardization holds {len(statistics['columns'])} channels ({statistics['columns'][:4]}), the model "
            f"takes {channels}: pass the statistics of the data it was trained on"
        )
    scaled = [i for i, name in enumerate(metadata["inputs"]) if name in VALUE_INPUTS]
    wrapped = InUserUnits(graph, statistics["mean"], statistics["std"], scaled)
    by_position = dynamic if "inputs" in dynamic else {"inputs": tuple(dynamic.get(n) for n in metadata["inputs"])}
    return wrapped, by_position, {**metadata, "units": YOURS, "standardization": statistics}
