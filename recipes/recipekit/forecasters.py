"""The forecasting model zoo of the Smartformer recipes: sizes and fresh (or pretrained) models per family."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    AutoformerConfig,
    AutoformerForPrediction,
    InformerConfig,
    InformerForPrediction,
    PatchTSTConfig,
    PatchTSTForPrediction,
)

from hf_tensorcompress.data import NUM_TIME_FEATURES
from hf_tensorcompress.data.summary import covariate_note  # noqa: F401  (the recipes' covariate line)

FAMILIES = ("autoformer", "patchtst", "informer")
CLASSES = {"autoformer": AutoformerForPrediction, "patchtst": PatchTSTForPrediction, "informer": InformerForPrediction}


@dataclass(frozen=True)
class Size:
    """Model size and training length; the defaults finish in minutes on 2 CPU cores, ``--full`` is the paper's."""

    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    ffn: int
    steps: int
    batch_size: int
    train_stride: int
    eval_stride: int
    interval: int
    consecutive_actions: int
    max_actions_per_layer: int
    grid: tuple[float, ...]
    validate_every: int
    patch_length: int = 16
    patch_stride: int = 8


SMALL = Size(32, 4, 2, 1, 64, 600, 32, 8, 16, 8, 3, 6, (0.3, 0.6, 1.0), 25)
#: ``--size medium``: where the attention projections are a real share of the model (see the README's table).
MEDIUM = Size(128, 8, 2, 1, 256, 200, 16, 8, 16, 8, 3, 6, (), 25)
FULL = Size(512, 8, 2, 1, 2048, 3000, 32, 1, 1, 100, 5, 15, tuple(k / 10 for k in range(1, 11)), 100)
SIZES = {"demo": SMALL, "medium": MEDIUM, "full": FULL}


def build_model(family: str, channels: int, context: int, horizon: int, size: Size, seed: int, path: str | None = None):
    """A fresh model of ``family`` (seeded), or the dense checkpoint at ``path`` (its config sets the shapes)."""
    torch.manual_seed(seed)
    if path is not None:
        model = CLASSES[family].from_pretrained(path)
        if getattr(model.config, "compression_config", None):
            raise ValueError(f"--model-path {path} is already compressed; the comparison starts from a dense model")
        return model
    if family == "patchtst":
        config = PatchTSTConfig(
            num_input_channels=channels,
            context_length=context,
            prediction_length=horizon,
            patch_length=size.patch_length,
            patch_stride=size.patch_stride,
            d_model=size.d_model,
            num_attention_heads=size.heads,
            num_hidden_layers=size.encoder_layers,
            ffn_dim=size.ffn,
        )
        return PatchTSTForPrediction(config)
    common = dict(
        input_size=channels,
        context_length=context,
        prediction_length=horizon,
        num_time_features=NUM_TIME_FEATURES,
        d_model=size.d_model,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn,
        lags_sequence=[1, 2, 3, 4, 5, 6, 7],
    )
    if family == "autoformer":
        return AutoformerForPrediction(AutoformerConfig(label_length=context // 2, **common))
    return InformerForPrediction(InformerConfig(attention_type="full", num_parallel_samples=20, **common))
