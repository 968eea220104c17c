"""Device, dtype and timing shared by the benchmarks: ``--device cuda --dtype bf16`` runs a benchmark on a GPU,
timed with CUDA events and measured with ``torch.cuda.max_memory_allocated``; on the CPU, wall-clock time."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="the model's dtype")


def device_and_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """The requested device and dtype; an error if the device is not there."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device is visible on this machine; use --device cpu")
    return device, DTYPES[args.dtype]


def seconds(function: Callable[[], object], device: torch.device) -> float:
    """Time of one call: CUDA events around it on a GPU (kernels are asynchronous), wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000
    start_time = time.perf_counter()
    function()
    return time.perf_counter() - start_time


def side_by_side(
    first: Callable[[], object],
    second: Callable[[], object],
    device: torch.device,
    repeats: int,
    before: Callable[[], object] | None = None,
) -> tuple[float, float]:
    """Best-of-``repeats`` times of two functions run alternately, so machine noise hits both; ``before`` runs,
    untimed, ahead of every timed call (e.g. to push what the last call read out of the caches)."""
    first(), second()

    def timed(function: Callable[[], object]) -> float:
        if before is not None:
            before()
        return seconds(function, device)

    pairs = [(timed(first), timed(second)) for _ in range(repeats)]
    return min(p[0] for p in pairs), min(p[1] for p in pairs)


def peak_memory(function: Callable[[], object], device: torch.device) -> int | None:
    """Peak bytes allocated on a GPU while ``function`` runs, above what was allocated before; None on the CPU."""
    if device.type != "cuda":
        function()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    function()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
