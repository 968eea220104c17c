"""Property-based tests (Hypothesis): any config of any method on a tiny model of each family either compresses it
(the forward then gives the dense output's shape) or raises the library's ValueError with the model's state dict,
class and config unchanged; any small table given to the forecasting or classification reader either loads or
raises the library's ValueError. Fast tier: a fixed seed and 50 examples per method (on PatchTST, or Llama for tt;
cp without its decomposition) and per reader; slow tier: 300, every family and option."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from fuzz_strategies import configs, tables
from helpers import first_output, tiny_causal_lm, tiny_inputs, tiny_time_series
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hf_tensorcompress import apply_compression
from hf_tensorcompress.data import load_forecasting_dataset
from hf_tensorcompress.data.classification import SeriesColumns, load_classification_dataset

FAST, SLOW = 50, 300
FAMILIES = {
    "cp": ("patchtst", "autoformer", "informer"),
    "svd": ("patchtst", "autoformer", "informer"),
    "biprop": ("patchtst", "autoformer", "informer"),
    "tt": ("llama", "gpt2", "opt"),
    "tiered": ("llama", "gpt2", "opt"),
}
#: The fast tier's family per method (the slow tier draws every family).
FAST_FAMILY = {"cp": "patchtst", "svd": "patchtst", "biprop": "patchtst", "tt": "llama", "tiered": "llama"}
INPUT_NAMES = {
    "patchtst": "PatchTSTForPrediction",
    "autoformer": "AutoformerForPrediction",
    "informer": "InformerForPrediction",
}
IDS = torch.tensor([[3, 4, 5, 6]])


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run faster on one thread than on several contending for two cores (about 5x here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def dense(family: str) -> tuple[torch.nn.Module, dict, torch.Size]:
    """A tiny model of ``family``, its inputs and its dense output shape (built once; each example copies it)."""
    model = tiny_causal_lm(family) if family in ("llama", "gpt2", "opt") else tiny_time_series(family)
    inputs = {"input_ids": IDS} if family in ("llama", "gpt2", "opt") else tiny_inputs(INPUT_NAMES[family], model)
    return model, inputs, forward(model, inputs).shape


def forward(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    torch.manual_seed(0)  # Informer's ProbSparse attention samples keys
    with torch.no_grad():
        return first_output(model(**inputs))


def snapshot(model: torch.nn.Module) -> tuple:
    return type(model), {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_json_string()


def unchanged(before: tuple, model: torch.nn.Module) -> bool:
    after = snapshot(model)
    same_tensors = before[1].keys() == after[1].keys() and all(
        torch.equal(before[1][k], after[1][k]) for k in before[1] if not before[1][k].is_meta
    )
    return before[0] is after[0] and before[2] == after[2] and same_tensors


def compress_or_refuse(method: str, family: str, config: dict) -> None:
    """The property: compressed with the dense output shape, or refused (ValueError) with nothing changed."""
    original, inputs, shape = dense(family)
    model = copy.deepcopy(original)
    before = snapshot(model)
    try:
        apply_compression(model, config)
    except ValueError as error:
        assert str(error), "an error must say what is wrong"
        assert unchanged(before, model), f"refused {config} ({error}) but changed the model"
        event("refused")  # --hypothesis-show-statistics: how often each outcome was drawn
        return
    event("compressed")
    assert model.config.compression_config["method"] == config["method"]
    assert forward(model, inputs).shape == shape


def config_property(method: str, examples: int):
    fast = examples <= FAST
    families = (FAST_FAMILY[method],) if fast else FAMILIES[method]

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(family=st.sampled_from(families), config=configs(method, fast=fast))
    def check(family: str, config: dict) -> None:
        compress_or_refuse(method, family, config)

    return check


@pytest.mark.parametrize("method", list(FAMILIES))
def test_fuzzed_configs(method):
    config_property(method, FAST)()


@pytest.mark.slow
@pytest.mark.parametrize("method", list(FAMILIES))
def test_fuzzed_configs_many(method):
    config_property(method, SLOW)()


def read(kind: str, frame, folder) -> None:
    """Write ``frame`` as CSV and read it back through ``kind``'s reader: loads, or raises the library's ValueError."""
    path = folder / f"{kind}.csv"
    frame.to_csv(path, index=False)
    original = path.read_bytes()
    try:
        if kind == "forecasting":
            data = load_forecasting_dataset(str(path))
        else:
            columns = SeriesColumns("label", "series", "t") if "series" in frame.columns else SeriesColumns("label")
            data = load_classification_dataset(str(path), columns=columns)
    except ValueError as error:
        assert str(error)
        event("refused")
        return
    finally:
        assert path.read_bytes() == original  # the user's file is only read
    assert set(data) == {"train", "validation", "test"} and all(len(split) for split in data.values())
    event("loaded")


def reader_property(kind: str, examples: int, folder):
    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frame=tables(kind))
    def check(frame) -> None:
        read(kind, frame, folder)

    return check


@pytest.mark.parametrize("kind", ["forecasting", "classification"])
def test_fuzzed_tables(kind, tmp_path):
    reader_property(kind, FAST, tmp_path)()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["forecasting", "classification"])
def test_fuzzed_tables_many(kind, tmp_path):
    reader_property(kind, SLOW, tmp_path)()
