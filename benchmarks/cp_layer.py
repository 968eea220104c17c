"""CP layer against the nn.Linear it replaces, at every rank of the search's action space; warm vs cold re-decomposition.

Prints one row per rank and, last, one JSON line. Ratios are measured side by side in one run (dense and CP
timed alternately), so machine noise hits both. Targets (issue 2): CP forward never slower than 1.2× dense at
any rank (the inference forward; the training-mode forward is reported beside it); a warm-started rank change at
most 1/5 the time of a cold tensorly ``parafac`` at the same rank.

    python benchmarks/cp_layer.py                 # the paper's Autoformer attention: d_model 512, 8 heads
    python benchmarks/cp_layer.py --d-model 128 --heads 8 --tokens 2048
    python benchmarks/cp_layer.py --device cuda --dtype bf16   # CUDA events, peak GPU memory

Each rank also reports forward+backward (a training step's layer cost) against dense, and on a GPU the peak memory
of both.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import tensorly as tl
import torch
from tensorly.decomposition import parafac
from timing import add_device_arguments, device_and_dtype, peak_memory, side_by_side
from torch import nn

from hf_tensorcompress.methods.cp.apply import decompose
from hf_tensorcompress.methods.cp.layer import CPLinear, cp_reconstruct


def action_space_ranks(fan_in: int, fan_out: int, heads: int) -> list[int]:
    """every rank if ≤ 10 candidates, else the ranks at parameter ratios 0.1 … 1.0 of dense."""
    per_rank = heads + fan_in // heads + fan_out
    largest = fan_in * fan_out // per_rank
    if largest <= 10:
        return list(range(1, largest + 1))
    return [max(1, int(ratio / 10 * fan_in * fan_out / per_rank)) for ratio in range(1, 11)]


def relative_error(factors: list[torch.Tensor], tensor: torch.Tensor) -> float:
    return float((cp_reconstruct([f.double() for f in factors]) - tensor).norm() / tensor.norm().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32 * 96, help="rows per forward (batch × sequence)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cold-iterations", type=int, default=100, help="tensorly parafac's n_iter_max (its default)")
    add_device_arguments(parser)
    args = parser.parse_args()
    device, dtype = device_and_dtype(args)

    torch.manual_seed(0)
    linear = nn.Linear(args.d_model, args.d_model).to(device, dtype)
    x = torch.randn(args.tokens, args.d_model, device=device, dtype=dtype)
    ranks = action_space_ranks(args.d_model, args.d_model, args.heads)
    start_rank = ranks[len(ranks) // 2]
    layer = CPLinear(args.d_model, args.d_model, args.heads, start_rank).to(device, dtype)
    layer.load_factors(decompose(layer.folded_weight(linear.weight.detach()), start_rank, 30))
    layer.bias.data.copy_(linear.bias.data)
    start_factors = [f.detach().clone() for f in layer.factors]
    # What a rank change decomposes: the tensor the current factors represent.
    target = cp_reconstruct([f.double() for f in start_factors])
    print(
        f"d_model={args.d_model} heads={args.heads} tokens={args.tokens} device={device} dtype={args.dtype} "
        f"action-space ranks={ranks}"
    )
    print(
        "rank | params % | infer ratio | train-fwd ratio | fwd+bwd ratio | path | warm s | cold s | warm/cold | "
        "err warm | err cold"
    )

    def forward_backward(module: nn.Module) -> None:
        module(x).sum().backward()

    rows = []
    for rank in ranks:
        layer.load_factors(start_factors)  # every rank change starts from the same layer
        warm_start = time.perf_counter()
        layer.set_rank(rank)
        warm_seconds = time.perf_counter() - warm_start
        warm_error = relative_error([f.detach() for f in layer.factors], target)

        cold_start = time.perf_counter()
        with tl.backend_context("pytorch"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, cold_factors = parafac(target, rank=rank, init="svd", n_iter_max=args.cold_iterations)
        cold_seconds = time.perf_counter() - cold_start
        cold_error = relative_error(cold_factors, target)

        with torch.no_grad():
            dense_infer, cp_infer = side_by_side(lambda: linear(x), lambda: layer(x), device, args.repeats)
        dense_train, cp_train = side_by_side(lambda: linear(x), lambda: layer(x), device, args.repeats)
        dense_step, cp_step = side_by_side(
            lambda: forward_backward(linear), lambda: forward_backward(layer), device, args.repeats
        )
        dense_peak, cp_peak = (
            peak_memory(lambda: forward_backward(linear), device),
            peak_memory(lambda: forward_backward(layer), device),
        )
        row = {
            "rank": rank,
            "param_ratio": sum(p.numel() for p in layer.factors) / linear.weight.numel(),
            "inference_ratio": cp_infer / dense_infer,
            "training_forward_ratio": cp_train / dense_train,
            "forward_backward_ratio": cp_step / dense_step,
            "peak_memory_ratio": None if dense_peak is None else cp_peak / max(dense_peak, 1),
            "path": layer.multiply_adds(args.tokens)[1],
            "warm_seconds": warm_seconds,
            "cold_seconds": cold_seconds,
            "warm_over_cold": warm_seconds / cold_seconds,
            "warm_error": warm_error,
            "cold_error": cold_error,
        }
        rows.append(row)
        print(
            f"{rank:4d} | {100 * row['param_ratio']:7.1f}% | {row['inference_ratio']:11.2f} | "
            f"{row['training_forward_ratio']:15.2f} | {row['forward_backward_ratio']:13.2f} | {row['path']:11s} | {warm_seconds:6.3f} | {cold_seconds:6.3f} | "
            f"{row['warm_over_cold']:9.3f} | {warm_error:8.4f} | {cold_error:8.4f}"
        )

    summary = {
        "benchmark": "cp_layer",
        "d_model": args.d_model,
        "heads": args.heads,
        "tokens": args.tokens,
        "device": str(device),
        "dtype": args.dtype,
        "max_forward_backward_ratio": max(r["forward_backward_ratio"] for r in rows),
        "max_inference_ratio": max(r["inference_ratio"] for r in rows),
        "max_training_forward_ratio": max(r["training_forward_ratio"] for r in rows),
        "max_warm_over_cold": max(r["warm_over_cold"] for r in rows),
        "max_warm_error_minus_cold_error": max(r["warm_error"] - r["cold_error"] for r in rows),
        # The target is on the forward pass as served (inference). A training-mode forward at the reconstruct
        # ranks also rebuilds W from the factors (R/N extra multiply-adds per row; 15 % at rank 448, 3072 rows),
        # which no path avoids while the factors change every step: reported above, not part of the target.
        "forward_target_met": max(r["inference_ratio"] for r in rows) <= 1.2,
        "rank_change_target_met": max(r["warm_over_cold"] for r in rows) <= 0.2,
        "rows": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
