"""Run an exported model with ONNX Runtime and numpy only: no torch, no transformers, no hf_tensorcompress runtime.

    from hf_tensorcompress.deploy.onnx.runner import load, forecast, generate
    session = load("patchtst.onnx", threads=2)
    prediction = forecast(session, past_values)        # (batch, context, channels) float32 → the model's forecast
    mean = forecast(load("informer.onnx"), past_values, past_time_features=..., future_time_features=...)
    tokens = generate(load("lm.onnx"), [1, 42, 7], 32)  # greedy, with the KV cache the graph carries

A forecaster exported with its training statistics (``standardization.json`` beside the model) takes and returns
values in your units: the graph standardises them itself (``metadata(session)["units"]`` says which applies).

In an environment without torch, install the library without its dependencies (``pip install --no-deps
hf_tensorcompress onnxruntime numpy``, plus ``tokenizers`` to turn text into ids) or copy this one file: it imports
nothing else from the library. ``fold_constants=False`` keeps the packed tensors packed in memory too (ONNX Runtime
otherwise folds each decode of a stored tensor into a float initializer when it loads the file: faster, but the
memory of the dense model).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

METADATA_KEY = "hf_tensorcompress"


def load(path: str | Path, threads: int | None = None, fold_constants: bool = True) -> ort.InferenceSession:
    """An ONNX Runtime CPU session of an exported file (``threads``: intra-op threads; None: ONNX Runtime's default)."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    disabled = [] if fold_constants else ["ConstantFolding"]
    return ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled or None
    )


def metadata(session: ort.InferenceSession) -> dict:
    """What the exporter recorded about the model (kind, input and output names, sizes)."""
    return json.loads(session.get_modelmeta().custom_metadata_map[METADATA_KEY])


def _expect(session: ort.InferenceSession, kind: str) -> dict:
    info = metadata(session)
    if info["kind"] != kind:
        raise ValueError(f"this file holds a {info['kind']} model ({info['architecture']}), not a {kind} model")
    return info


def forecast(session: ort.InferenceSession, past_values: np.ndarray, **features: np.ndarray) -> np.ndarray:
    """The exported PatchTST's output for ``past_values`` (batch, context_length, channels): the forecast, or the
    class logits / regression values of a classification or regression head.

    Autoformer and Informer also take ``past_time_features`` and ``future_time_features`` (and the static features
    their config has; ``past_observed_mask`` defaults to all observed) and give the mean forecast (batch,
    prediction_length[, input_size]): Autoformer's from one run, Informer's by mean feedback (``_mean_feedback``)."""
    info = _expect(session, "forecast")
    if "input_shapes" in info:
        feeds = _time_series_feeds(session, info, {"past_values": past_values, **features})
        if info["decoding"] == "mean_feedback":
            return _mean_feedback(session, feeds, info["prediction_length"])
        return session.run(None, feeds)[0]
    values = np.asarray(past_values, dtype=np.float32)
    expected = (info["context_length"], info["num_input_channels"])
    if values.ndim != 3 or values.shape[1:] != expected:
        raise ValueError(f"past_values has shape {values.shape}; the model takes (batch, {expected[0]}, {expected[1]})")
    return session.run(None, {"past_values": values})[0]


def _time_series_feeds(session: ort.InferenceSession, info: dict, given: dict[str, np.ndarray]) -> dict:
    """The graph's inputs from ``given`` (cast to the graph's dtypes, shapes checked against the metadata)."""
    if "past_observed_mask" not in given:
        given["past_observed_mask"] = np.ones_like(given["past_values"], dtype=np.float32)
    dtypes = {arg.name: np.int64 if arg.type == "tensor(int64)" else np.float32 for arg in session.get_inputs()}
    wanted = [name for name in info["inputs"] if name != "future_values"]
    wrong = [name for name in wanted if name not in given] + sorted(set(given) - set(wanted))
    if wrong:
        raise ValueError(f"the model takes {wanted}; missing or unknown: {wrong}")
    feeds = {name: np.asarray(given[name], dtype=dtypes[name]) for name in wanted}
    for name, value in feeds.items():
        shape = info["input_shapes"][name]
        if value.ndim != len(shape) or any(size not in (None, got) for size, got in zip(shape, value.shape)):
            raise ValueError(f"{name} has shape {value.shape}; the model takes {tuple(shape)} (None: the batch)")
    return feeds


def _mean_feedback(session: ort.InferenceSession, feeds: dict[str, np.ndarray], horizon: int) -> np.ndarray:
    """Informer's deterministic forecast: run the teacher-forced graph once per step; step ``k``'s distribution
    mean becomes the target value the later steps read (the graph's step ``k`` sees only the values before it)."""
    past = feeds["past_values"]
    future = np.zeros((past.shape[0], horizon, *past.shape[2:]), dtype=np.float32)
    for k in range(horizon):
        future[:, k] = session.run(["forecast"], {**feeds, "future_values": future})[0][:, k]
    return future


def empty_cache(info: dict, batch: int) -> dict[str, np.ndarray]:
    """The KV cache before the first token: every layer's keys and values with no positions."""
    shape = (batch, info["num_key_value_heads"], 0, info["head_dim"])
    return {name: np.zeros(shape, dtype=np.float32) for name in info["cache_inputs"]}


def step(
    session: ort.InferenceSession, info: dict, input_ids: np.ndarray, cache: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One forward over ``input_ids`` (batch, new) after the ``cache`` positions: the last position's logits and
    the grown cache."""
    past = next(iter(cache.values())).shape[2]
    positions = np.arange(past, past + input_ids.shape[1], dtype=np.int64)[None].repeat(input_ids.shape[0], 0)
    feeds = {"input_ids": input_ids.astype(np.int64), "position_ids": positions, **cache}
    logits, *present = session.run(None, feeds)
    return logits[:, -1], dict(zip(info["cache_inputs"], present))


def generate(
    session: ort.InferenceSession, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None = None
) -> list[int]:
    """Greedy decoding: the prompt in one prefill step, then one token per step through the KV cache; the new
    tokens (stopping early at ``eos_token_id``)."""
    info = _expect(session, "causal_lm")
    logits, cache = step(session, info, np.asarray([prompt], dtype=np.int64), empty_cache(info, 1))
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        token = int(np.argmax(logits[0]))
        tokens.append(token)
        if token == eos_token_id or len(tokens) == max_new_tokens:
            break
        logits, cache = step(session, info, np.asarray([[token]], dtype=np.int64), cache)
    return tokens
