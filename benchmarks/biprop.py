"""Biprop layer speed, on-disk size and resident memory, measured side by side in one run.

    OMP_NUM_THREADS=1 python benchmarks/biprop.py [--features 512 --tokens 4096 --repeats 20 --batch 4]
    python benchmarks/biprop.py --device cuda --dtype bf16   # CUDA events; GPU memory instead of RSS

1. Forward time of ``BipropLinear`` in training mode (top-k mask + α every call), the trainable form in eval mode
   (mask and signs folded into one cached weight) and the inference-only form (packed bits, unpacked a block at a
   time) against the dense ``nn.Linear`` of the same shape.
2. The bytes of a saved PatchTST model, dense vs biprop on every encoder Linear.
3. A loaded model in a fresh process: a PatchTST classifier (``--layers`` 4, ``--d_model`` 512, FFN 4×) saved dense
   and biprop (keep ``--keep_ratio`` on every encoder Linear), each loaded with ``from_pretrained`` in its own new
   Python process and run once; the process's RSS growth, the bytes its Linear layers hold (parameters, buffers
   and caches) and its best forward time, in two alternating rounds (dense, biprop, dense, biprop; best time
   kept). The ratios are biprop over dense.

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from timing import add_device_arguments, device_and_dtype, seconds
from torch import nn
from transformers import PatchTSTConfig, PatchTSTForClassification

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.metrics import resident_bytes
from hf_tensorcompress.methods.biprop.layer import BipropLinear


def best_time(function, repeats: int, device: torch.device) -> float:
    """Best of ``repeats`` times (after one warm-up call): CUDA events on a GPU, wall clock on the CPU."""
    function()
    return min(seconds(function, device) for _ in range(repeats))


def layer_times(
    features: int, tokens: int, keep_ratio: float, repeats: int, device: torch.device, dtype: torch.dtype
) -> dict:
    torch.manual_seed(0)
    x = torch.randn(tokens, features, device=device, dtype=dtype)
    dense = nn.Linear(features, features).to(device, dtype)
    layer = BipropLinear(features, features, keep_ratio=keep_ratio).to(device, dtype)
    layer.train()
    train = best_time(lambda: layer(x), repeats, device)  # grad enabled: the training path
    layer.eval()
    packed = BipropLinear(features, features, keep_ratio=keep_ratio, trainable=False).to(device, dtype)
    with torch.no_grad():
        folded = best_time(lambda: layer(x), repeats, device)
        dense_time = best_time(lambda: dense(x), repeats, device)
        packed_time = best_time(lambda: packed(x), repeats, device)
    return {
        "dense_ms": dense_time * 1e3,
        "biprop_train_ms": train * 1e3,
        "biprop_folded_ms": folded * 1e3,
        "biprop_packed_ms": packed_time * 1e3,
        "train_over_dense": train / dense_time,
        "folded_over_dense": folded / dense_time,
        "packed_over_dense": packed_time / dense_time,
    }


def saved_bytes(keep_ratio: float, d_model: int) -> dict:
    config = PatchTSTConfig(
        num_input_channels=12,
        context_length=29,
        patch_length=1,
        patch_stride=1,
        d_model=d_model,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=4 * d_model,
        num_targets=9,
    )
    torch.manual_seed(0)
    dense = PatchTSTForClassification(config)
    biprop = apply_compression(
        PatchTSTForClassification(config),
        CompressionConfig(method="biprop", target_modules="all-linear", keep_ratio=keep_ratio),
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


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``)."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_loaded(path: str, batch: int, repeats: int, device: torch.device, dtype: torch.dtype) -> dict:
    """In this (fresh) process: memory growth of loading ``path`` and one forward (RSS on the CPU, allocated GPU
    memory on a GPU), Linear-layer bytes, best time."""
    from transformers import AutoModel  # imported before the baseline RSS: only the model's own memory counts

    import hf_tensorcompress  # noqa: F401  (registers the loader for compressed checkpoints)

    torch.manual_seed(0)
    used = (lambda: torch.cuda.memory_allocated(device)) if device.type == "cuda" else rss_bytes
    before = used()
    model = AutoModel.from_pretrained(path).to(device, dtype).eval()
    config = model.config
    x = torch.randn(batch, config.context_length, config.num_input_channels, device=device, dtype=dtype)
    with torch.no_grad():
        model(past_values=x)
        after = used()
        forward = best_time(lambda: model(past_values=x), repeats, device)
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, BipropLinear))]
    return {"rss_growth": after - before, "linear_bytes": sum(resident_bytes(m) for m in layers), "forward_s": forward}


def loaded_models(
    layers: int, d_model: int, keep_ratio: float, batch: int, repeats: int, device_args: list[str]
) -> dict:
    """Dense and biprop PatchTST, each saved and then loaded in fresh processes (two alternating rounds)."""
    config = PatchTSTConfig(
        num_input_channels=12,
        context_length=64,
        patch_length=1,
        patch_stride=1,
        d_model=d_model,
        num_attention_heads=8,
        num_hidden_layers=layers,
        ffn_dim=4 * d_model,
        num_targets=9,
    )
    runs: dict[str, list[dict]] = {"dense": [], "biprop": []}
    with tempfile.TemporaryDirectory() as tmp:
        PatchTSTForClassification(config).save_pretrained(Path(tmp) / "dense")
        apply_compression(
            PatchTSTForClassification(config),
            CompressionConfig(method="biprop", target_modules="all-linear", keep_ratio=keep_ratio),
        ).save_pretrained(Path(tmp) / "biprop")
        for _ in range(2):
            for label in runs:
                command = [
                    sys.executable,
                    __file__,
                    "--measure",
                    str(Path(tmp) / label),
                    "--batch",
                    str(batch),
                    "--repeats",
                    str(repeats),
                    *device_args,
                ]
                output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                runs[label].append(json.loads(output.strip().splitlines()[-1]))
    dense, biprop = runs["dense"], runs["biprop"]
    figures = {
        "dense_rss_growth": dense[0]["rss_growth"],
        "biprop_rss_growth": biprop[0]["rss_growth"],
        "dense_linear_bytes": dense[0]["linear_bytes"],
        "biprop_linear_bytes": biprop[0]["linear_bytes"],
        "dense_forward_ms": min(r["forward_s"] for r in dense) * 1e3,
        "biprop_forward_ms": min(r["forward_s"] for r in biprop) * 1e3,
    }
    return figures | {
        "linear_bytes_ratio": figures["biprop_linear_bytes"] / figures["dense_linear_bytes"],
        "rss_growth_ratio": figures["biprop_rss_growth"] / figures["dense_rss_growth"],
        "forward_time_ratio": figures["biprop_forward_ms"] / figures["dense_forward_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--keep_ratio", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--loaded_d_model", type=int, default=512, help="loaded-model test: d_model (FFN 4×)")
    parser.add_argument("--layers", type=int, default=4, help="loaded-model test: encoder layers")
    parser.add_argument(
        "--batch", type=int, default=4, help="loaded-model test: windows per forward (x 12 channels x 64 steps)"
    )
    parser.add_argument("--loaded_repeats", type=int, default=5, help="loaded-model test: timed forwards per process")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the fresh process of one loaded model
    add_device_arguments(parser)
    args = parser.parse_args()
    device, dtype = device_and_dtype(args)
    if args.measure:
        print(json.dumps(measure_loaded(args.measure, args.batch, args.repeats, device, dtype)))
        return
    times = layer_times(args.features, args.tokens, args.keep_ratio, args.repeats, device, dtype)
    print(
        f"forward {args.tokens}x{args.features} -> {args.features}: dense {times['dense_ms']:.2f} ms, "
        f"biprop train {times['biprop_train_ms']:.2f} ms (x{times['train_over_dense']:.2f}), "
        f"folded {times['biprop_folded_ms']:.2f} ms (x{times['folded_over_dense']:.2f}), "
        f"packed inference form {times['biprop_packed_ms']:.2f} ms (x{times['packed_over_dense']:.2f})"
    )
    sizes = saved_bytes(args.keep_ratio, args.d_model)
    print(
        f"saved PatchTST (d_model={args.d_model}, every encoder Linear biprop): file {sizes['dense_file_bytes']} -> "
        f"{sizes['biprop_file_bytes']} bytes (x{sizes['file_bytes_ratio']:.1f}); biprop layers "
        f"{sizes['dense_layer_bytes']} -> {sizes['biprop_layer_bytes']} bytes (x{sizes['layer_bytes_ratio']:.1f})"
    )
    device_args = ["--device", args.device, "--dtype", args.dtype]
    loaded = loaded_models(
        args.layers, args.loaded_d_model, args.keep_ratio, args.batch, args.loaded_repeats, device_args
    )
    print(
        f"loaded PatchTST ({args.layers} layers, d_model {args.loaded_d_model}, FFN {4 * args.loaded_d_model}), fresh "
        f"process each: Linear layers hold {loaded['dense_linear_bytes']:,} -> {loaded['biprop_linear_bytes']:,} bytes "
        f"(x{loaded['linear_bytes_ratio']:.3f}); RSS growth {loaded['dense_rss_growth'] / 2**20:.1f} -> "
        f"{loaded['biprop_rss_growth'] / 2**20:.1f} MB (x{loaded['rss_growth_ratio']:.3f}); forward "
        f"{loaded['dense_forward_ms']:.1f} -> {loaded['biprop_forward_ms']:.1f} ms (x{loaded['forward_time_ratio']:.2f})"
    )
    loaded = {f"loaded_{key}": value for key, value in loaded.items()}
    print(
        json.dumps(
            {
                "features": args.features,
                "tokens": args.tokens,
                "keep_ratio": args.keep_ratio,
                "device": str(device),
                "dtype": args.dtype,
                **times,
                **sizes,
                **loaded,
            }
        )
    )


if __name__ == "__main__":
    main()
