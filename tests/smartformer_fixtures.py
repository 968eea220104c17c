"""Tiny PatchTST models and small data sets shared by the search / trainer / distributed tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression

CONTEXT, HORIZON, CHANNELS = 32, 8, 3


def dense_patchtst(layers: int = 2, seed: int = 0) -> PatchTSTForPrediction:
    """The tiny PatchTST the search tests train, dense (seeded)."""
    torch.manual_seed(seed)
    config = PatchTSTConfig(
        num_input_channels=CHANNELS,
        context_length=CONTEXT,
        patch_length=8,
        patch_stride=8,
        d_model=16,
        num_attention_heads=4,
        num_hidden_layers=layers,
        ffn_dim=32,
        prediction_length=HORIZON,
    )
    return PatchTSTForPrediction(config)


def search_trainer(folder, search, steps: int = 40, save_steps: int | None = None, layers: int = 1):
    """A ``SmartformerTrainer`` running ``search`` (a ``SearchConfig``) on a tiny dense PatchTST of ``layers`` encoder
    layers for ``steps`` steps, on sines (``eval_dataset``: held-out sines); checkpoints every ``save_steps`` where
    given."""
    from hf_tensorcompress.search.trainer import SmartformerTrainer

    args = TrainingArguments(
        str(folder), max_steps=steps, per_device_train_batch_size=16, learning_rate=1e-3, report_to=[],
        use_cpu=True, seed=0, data_seed=0, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
    )  # fmt: skip
    return SmartformerTrainer(
        model=dense_patchtst(layers=layers),
        args=args,
        train_dataset=sines(400),
        eval_dataset=sines(200, seed=2),
        search=search,
    )


def tiny_patchtst(method: str = "cp", rank: int | float = 1.0, layers: int = 2, seed: int = 0) -> PatchTSTForPrediction:
    return apply_compression(dense_patchtst(layers, seed), CompressionConfig(method=method, rank=rank))


class Windows(torch.utils.data.Dataset):
    """(past, future) windows of a (time, channels) series, as PatchTST's ``past_values`` / ``future_values``."""

    def __init__(self, series: torch.Tensor, stride: int = 1) -> None:
        self.series = series.float()
        self.starts = list(range(0, len(series) - CONTEXT - HORIZON + 1, stride))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index]
        window = self.series[start : start + CONTEXT + HORIZON]
        return {"past_values": window[:CONTEXT], "future_values": window[CONTEXT:]}


def quick_training_arguments(output_dir, max_steps: int, learning_rate: float, **overrides) -> TrainingArguments:
    """A few seeded CPU steps of batch 16, nothing saved (unless ``overrides`` say so) or reported: a callback test's
    ``Trainer`` arguments."""
    settings = dict(
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=learning_rate,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    return TrainingArguments(str(output_dir), **{**settings, **overrides})


def sines(length: int = 600, seed: int = 0) -> Windows:
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(length).float()[:, None]
    frequency = torch.rand(1, CHANNELS, generator=generator) * 0.4 + 0.1
    phase = torch.rand(1, CHANNELS, generator=generator) * 6
    return Windows(torch.sin(t * frequency + phase) + 0.05 * torch.randn(length, CHANNELS, generator=generator))


def appliances(rows: int = 1200) -> Windows:
    """The first rows of the real UCI Appliances Energy data (3 channels: Appliances, lights, T1), standardised."""
    import pandas as pd

    from hf_tensorcompress.assets import appliances_energy_csv

    frame = pd.read_csv(appliances_energy_csv(), usecols=["Appliances", "lights", "T1"], nrows=rows)
    values = torch.tensor(frame.to_numpy(), dtype=torch.float32)
    return Windows((values - values.mean(0)) / values.std(0).clamp_min(1e-6), stride=2)


FORECAST_CHECK = """
    import torch
    io = torch.load("io.pt")
    model = {load}
    model.eval()
    with torch.no_grad():
        got = model(past_values=io["past"]).prediction_outputs
    assert torch.allclose(got, io["expected"], atol=1e-5), (got - io["expected"]).abs().max()
    print("ok")
"""


def assert_forecasts_in_new_processes(folder: Path) -> None:
    """``folder/saved`` forecasts ``folder/io.pt``'s expected outputs in a new process, loaded by the library and
    with ``trust_remote_code`` where the library is not installed."""
    from tests.helpers import run_without_library

    native = "__import__('hf_tensorcompress.loading').loading.load_model('saved')"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORECAST_CHECK.format(load=native))],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
    remote = "__import__('transformers').AutoModel.from_pretrained('saved', trust_remote_code=True)"
    assert "ok" in run_without_library(textwrap.dedent(FORECAST_CHECK.format(load=remote)), folder).stdout
