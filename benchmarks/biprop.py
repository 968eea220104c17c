"""Biprop layer speed and on-disk size, measured side by side in one run.

    OMP_NUM_THREADS=1 python benchmarks/biprop.py [--features 512 --tokens 4096 --repeats 20]

Forward time of ``BipropLinear`` in training mode (top-k mask + α every call) and in inference mode (mask and signs
folded into one cached weight) against the dense ``nn.Linear`` of the same shape; then the bytes of a saved
PatchTST model, dense vs biprop on every encoder Linear. The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import PatchTSTConfig, PatchTSTForClassification

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.methods.biprop.layer import BipropLinear


def best_time(function, repeats: int) -> float:
    """Best of ``repeats`` wall-clock seconds (after one warm-up call)."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def layer_times(features: int, tokens: int, keep_ratio: float, repeats: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(tokens, features)
    dense = nn.Linear(features, features)
    layer = BipropLinear(features, features, keep_ratio=keep_ratio)
    layer.train()
    train = best_time(lambda: layer(x), repeats)  # grad enabled: the training path
    layer.eval()
    with torch.no_grad():
        folded = best_time(lambda: layer(x), repeats)
        dense_time = best_time(lambda: dense(x), repeats)
    return {
        "dense_ms": dense_time * 1e3,
        "biprop_train_ms": train * 1e3,
        "biprop_folded_ms": folded * 1e3,
        "train_over_dense": train / dense_time,
        "folded_over_dense": folded / dense_time,
    }


def saved_bytes(keep_ratio: float, d_model: int) -> dict:
    config = PatchTSTConfig(
        num_input_channels=12, context_length=29, patch_length=1, patch_stride=1, d_model=d_model,
        num_attention_heads=4, num_hidden_layers=2, ffn_dim=4 * d_model, num_targets=9,
    )
    torch.manual_seed(0)
    dense = PatchTSTForClassification(config)
    biprop = apply_compression(
        PatchTSTForClassification(config), CompressionConfig(method="biprop", target_modules="all-linear", keep_ratio=keep_ratio)
    )
    names = list(biprop.config.compression_config["modules"])
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, model in (("dense", dense), ("biprop", biprop)):
            model.save_pretrained(Path(tmp) / label)
            path = Path(tmp) / label / "model.safetensors"
            with safe_open(str(path), "pt") as handle:
                layer_bytes = sum(
                    handle.get_tensor(key).numel() * handle.get_tensor(key).element_size()
                    for key in handle.keys()
                    if any(key.startswith(name + ".") for name in names)
                )
            sizes[label] = {"file_bytes": path.stat().st_size, "target_layer_bytes": layer_bytes}
    return {
        "dense_file_bytes": sizes["dense"]["file_bytes"],
        "biprop_file_bytes": sizes["biprop"]["file_bytes"],
        "dense_layer_bytes": sizes["dense"]["target_layer_bytes"],
        "biprop_layer_bytes": sizes["biprop"]["target_layer_bytes"],
        "layer_bytes_ratio": sizes["dense"]["target_layer_bytes"] / sizes["biprop"]["target_layer_bytes"],
        "file_bytes_ratio": sizes["dense"]["file_bytes"] / sizes["biprop"]["file_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--keep_ratio", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--d_model", type=int, default=128)
    args = parser.parse_args()
    times = layer_times(args.features, args.tokens, args.keep_ratio, args.repeats)
    print(f"forward {args.tokens}x{args.features} -> {args.features}: dense {times['dense_ms']:.2f} ms, "
          f"biprop train {times['biprop_train_ms']:.2f} ms (x{times['train_over_dense']:.2f}), "
          f"folded {times['biprop_folded_ms']:.2f} ms (x{times['folded_over_dense']:.2f})")
    sizes = saved_bytes(args.keep_ratio, args.d_model)
    print(f"saved PatchTST (d_model={args.d_model}, every encoder Linear biprop): file {sizes['dense_file_bytes']} -> "
          f"{sizes['biprop_file_bytes']} bytes (x{sizes['file_bytes_ratio']:.1f}); biprop layers "
          f"{sizes['dense_layer_bytes']} -> {sizes['biprop_layer_bytes']} bytes (x{sizes['layer_bytes_ratio']:.1f})")
    print(json.dumps({"features": args.features, "tokens": args.tokens, "keep_ratio": args.keep_ratio, **times, **sizes}))


if __name__ == "__main__":
    main()
