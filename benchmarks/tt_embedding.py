"""TT embedding performance on SmolLM2-135M's real 49152×576 token embedding, measured side by side.

    python benchmarks/tt_embedding.py [--shape 8 8 9 --ranks 5 5] [--loop-tokens 49152]
    python benchmarks/tt_embedding.py --device cuda --dtype bf16   # TT-SVD, lookup and head on a GPU

1. whole-vocabulary TT-SVD (``tt_svd``, batched, with each solver: exact ``eigh`` and block ``power`` iteration)
   against a per-token loop of tensorly's ``tensor_train`` at the same shape and ranks, with the relative
   reconstruction error of both (over the tokens the loop covered);
2. lookup of 32k random token ids: ``TTEmbedding`` against ``nn.Embedding`` (alternating; median of the paired ratios);
3. the tied output layer (logits over the whole vocabulary): ``TTTiedHead`` (rebuilds the matrix per forward)
   against the dense ``F.linear``, time and peak memory (each in a fresh process importing only torch and the
   layer file; the peak RSS is reset via /proc/self/clear_refs after setup, so it is weights + forward).
With ``--device cuda`` the TT-SVD, the lookup and the head run there (CUDA events; the head's peak is
``torch.cuda.max_memory_allocated`` above the weights), in ``--dtype``; the tensorly loop stays on the CPU.
The last line printed is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorly as tl
import torch
from safetensors import safe_open
from tensorly.decomposition import tensor_train
from timing import add_device_arguments, device_and_dtype, peak_memory, seconds
from tqdm.auto import tqdm

from hf_tensorcompress.core.export import write_modeling_code
from hf_tensorcompress.core.registry import get_method
from hf_tensorcompress.data.causal_lm import WEIGHTS_NOTE, smollm2_dir
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.layer import TTEmbedding
from hf_tensorcompress.methods.tt.solver import balanced_shape, tt_reconstruct, tt_svd


def smollm2_embedding() -> torch.Tensor:
    with safe_open(str(smollm2_dir() / "model.safetensors"), framework="pt") as handle:
        return handle.get_tensor("model.embed_tokens.weight").float()


def best_of(fn, repeats: int, device: torch.device) -> float:
    fn()
    return statistics.median(seconds(fn, device) for _ in range(repeats))


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def decomposition(
    weight: torch.Tensor, shape: list[int], ranks: list[int], loop_tokens: int, device: torch.device
) -> dict:
    """Both ``tt_svd`` solvers on the whole vocabulary (median of 3 after a warm-up call; on ``device``, in the
    weight's dtype) against tensorly's ``tensor_train`` called once per token on the CPU (only the decompositions
    timed, their reconstruction afterwards)."""
    subset = weight[:loop_tokens].float().numpy()
    on_device = weight.to(device)
    start = time.perf_counter()
    vectors = tqdm(subset, desc="tensorly loop", leave=False, mininterval=2)
    trains = [tensor_train(v.reshape(shape), [1, *ranks, 1]) for v in vectors]
    loop_seconds = (time.perf_counter() - start) * weight.shape[0] / loop_tokens
    loop_error = relative_error(np.stack([tl.tt_to_tensor(train).reshape(-1) for train in trains]), subset)
    result = {
        "tokens": weight.shape[0],
        "loop_tokens_timed": loop_tokens,
        "torch_threads": torch.get_num_threads(),
        "tensorly_loop_seconds": loop_seconds,
        "tensorly_error": loop_error,
        "solvers": {},
    }
    for solver in ("eigh", "power"):  # "auto" (the default) is "power" at fixed ranks
        cores, token_ranks = tt_svd(on_device, shape, ranks, solver=solver)
        if solver == "eigh":  # the exact trains serve the lookup and head measurements
            layer = TTEmbedding(weight.shape[0], shape, [core.shape[-1] for core in cores[:-1]]).to(on_device)
            layer._load(cores, token_ranks)
        solver_seconds = best_of(lambda solver=solver: tt_svd(on_device, shape, ranks, solver=solver), 3, device)
        error = relative_error(tt_reconstruct([core[:loop_tokens] for core in cores]).float().cpu().numpy(), subset)
        result["solvers"][solver] = {
            "seconds": solver_seconds,
            "speedup": loop_seconds / solver_seconds,
            "error": error,
            "error_ratio": error / loop_error,
        }
    return {**result, "layer": layer}


def lookup(weight: torch.Tensor, layer: TTEmbedding, count: int, repeats: int, device: torch.device) -> dict:
    """Dense and TT lookups alternate, so both see the same machine load; the ratio is the median of the pairs'."""
    dense = torch.nn.Embedding.from_pretrained(weight).to(device)
    ids = torch.randint(0, weight.shape[0], (count,), generator=torch.Generator().manual_seed(0)).to(device)
    pairs = []
    with torch.no_grad():
        dense(ids), layer(ids)  # warm-up
        for _ in range(repeats):
            pairs.append([seconds(lambda forward=forward: forward(ids), device) for forward in (dense, layer)])
    return {
        "ids": count,
        "pairs": repeats,
        "dense_seconds": statistics.median(p[0] for p in pairs),
        "tt_seconds": statistics.median(p[1] for p in pairs),
        "ratio": statistics.median(t / d for d, t in pairs),
    }


def checkpoint_code() -> str:
    """A folder holding the flat modeling files a checkpoint ships (torch only), for the fresh probe processes."""
    folder = Path(tempfile.mkdtemp(prefix="tt_code_"))
    package = folder / "checkpoint_code"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_modeling_code(package, [get_method("tt")])
    return str(folder)


HEAD_PROBE = """
import json, sys, time, statistics, torch
# the checkpoint's flat modeling code (torch only), so both processes start from the same torch-only baseline
sys.path.insert(0, {code_dir!r})
from checkpoint_code.tt_layer import TTEmbedding
from checkpoint_code.tt_head import TTTiedHead
# tensors are created in place (no load-then-copy), so the only big transient left is the forward's own;
# values are random: time and memory do not depend on them
vocab, dim, length = {vocab}, {dim}, {length}
hidden = torch.randn(1, length, dim)
if {dense!r}:
    weight = torch.randn(vocab, dim); forward = lambda: torch.nn.functional.linear(hidden, weight)
    resident = weight.numel() * 4
else:
    layer = TTEmbedding(vocab, {shape!r}, {ranks!r})
    with torch.no_grad():
        for core in layer.cores:
            core.normal_()
    head = TTTiedHead(layer); forward = lambda: head(hidden)
    resident = sum(p.numel() * 4 for p in layer.parameters())
def rss_mib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024

with torch.no_grad():
    forward()  # warm up (allocator, thread pools)
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    before = rss_mib("VmRSS")
    times = []
    for _ in range({repeats}):
        start = time.perf_counter(); forward(); times.append(time.perf_counter() - start)
    peak = rss_mib("VmHWM")
print(json.dumps({{"seconds": statistics.median(times), "rss_before_mib": before, "peak_rss_mib": peak,
                  "peak_growth_mib": peak - before, "resident_mib": resident / 2**20}}))
"""


def tied_head(weight: torch.Tensor, layer: TTEmbedding, length: int, repeats: int) -> dict:
    """Each variant in its own fresh process, so its peak RSS growth during the forward is its own."""
    results = {}
    for name, dense in (("dense", True), ("tt", False)):
        code = HEAD_PROBE.format(
            code_dir=checkpoint_code(),
            vocab=weight.shape[0],
            dim=weight.shape[1],
            length=length,
            dense=dense,
            shape=layer.shape,
            ranks=layer.ranks,
            repeats=repeats,
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    results["time_ratio"] = results["tt"]["seconds"] / results["dense"]["seconds"]
    results["tokens"] = length
    return results


SCALE_PROBE = """
import json, math, sys, time, torch
sys.path.insert(0, {code_dir!r})
from checkpoint_code import tt_solver as module
rows, dim, components = {rows}, {dim}, 256
def rss_mib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
# a stand-in with a decaying spectrum: 256 components with power-law singular values over a 5 % noise floor,
# written block by block into the (rows, dim) float32 table
generator = torch.Generator().manual_seed(0)
basis = torch.linalg.qr(torch.randn(dim, components, generator=generator))[0].T.contiguous()
decay = torch.arange(1, components + 1, dtype=torch.float32) ** -0.7
table = torch.empty(rows, dim)
for start in range(0, rows, 8192):
    block = table[start : start + 8192]
    torch.matmul(torch.randn(block.shape[0], components, generator=generator) * decay, basis, out=block)
    block.add_(torch.randn(block.shape, generator=generator), alpha=0.05 / math.sqrt(dim))
open("/proc/self/clear_refs", "w").write("5")
before = rss_mib("VmRSS")
start = time.perf_counter()
cores, _ = module.tt_svd(table, {shape!r}, {ranks!r}, solver={solver!r})
seconds = time.perf_counter() - start
peak = rss_mib("VmHWM")
sample = torch.arange(0, rows, max(1, rows // 4096))
error = float((module.tt_reconstruct(cores, sample) - table[sample]).norm() / table[sample].norm())
print(json.dumps({{"rows": rows, "dim": dim, "shape": {shape!r}, "ranks": {ranks!r}, "solver": {solver!r},
                  "seconds": seconds, "table_mib": table.numel() * 4 / 2**20, "rss_before_mib": before,
                  "peak_rss_mib": peak, "peak_over_table": (peak - before + table.numel() * 4 / 2**20)
                  / (table.numel() * 4 / 2**20), "cores_mib": sum(c.numel() for c in cores) * 4 / 2**20,
                  "relative_error_sampled": error, "threads": torch.get_num_threads()}}))
"""


def tied_head_on_device(
    weight: torch.Tensor, layer: TTEmbedding, length: int, repeats: int, device: torch.device
) -> dict:
    """The tied head on a GPU, in this process: time (CUDA events, median of alternating runs) and the peak memory a
    forward allocates above the weights (``torch.cuda.max_memory_allocated``)."""
    dense_weight = weight.to(device)
    hidden = torch.randn(1, length, weight.shape[1], device=device, dtype=weight.dtype)
    head = TTTiedHead(layer)
    variants = {"dense": lambda: torch.nn.functional.linear(hidden, dense_weight), "tt": lambda: head(hidden)}
    results = {}
    with torch.no_grad():
        for forward in variants.values():
            forward()
        times = {name: [] for name in variants}
        for _ in range(repeats):
            for name, forward in variants.items():
                times[name].append(seconds(forward, device))
        for name, forward in variants.items():
            resident = dense_weight if name == "dense" else torch.cat([p.reshape(-1) for p in layer.parameters()])
            results[name] = {
                "seconds": statistics.median(times[name]),
                "peak_growth_mib": peak_memory(forward, device) / 2**20,
                "resident_mib": resident.numel() * resident.element_size() / 2**20,
            }
    results["time_ratio"] = results["tt"]["seconds"] / results["dense"]["seconds"]
    results["tokens"] = length
    return results


def scale(rows: int, dim: int, ranks: list[int], solver: str) -> dict:
    """TT-SVD of a random ``rows × dim`` stand-in (e.g. an 8B model's 128k × 4096) in a fresh process: time and
    peak RSS while decomposing, relative to the table (``peak_over_table`` = (table + growth) / table)."""
    code = SCALE_PROBE.format(
        code_dir=checkpoint_code(), rows=rows, dim=dim, shape=balanced_shape(dim, 3), ranks=ranks, solver=solver
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs="+", default=[8, 8, 9])
    parser.add_argument("--ranks", type=int, nargs="+", default=[5, 5])
    parser.add_argument("--loop-tokens", type=int, default=49152, help="tokens the tensorly loop times (scaled up)")
    parser.add_argument("--lookup-ids", type=int, default=32768)
    parser.add_argument("--head-tokens", type=int, default=128, help="hidden states per output-layer forward")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--scale",
        type=int,
        nargs=2,
        metavar=("ROWS", "DIM"),
        help="only decompose a random ROWS x DIM stand-in (e.g. 131072 4096), ranks --ranks",
    )
    parser.add_argument("--solver", default="auto", help="with --scale: the tt_svd solver")
    add_device_arguments(parser)
    args = parser.parse_args()
    device, dtype = device_and_dtype(args)

    if args.scale:
        result = scale(*args.scale, args.ranks, args.solver)
        print(
            f"TT-SVD of a random {args.scale[0]} x {args.scale[1]} table ({result['table_mib']:.0f} MiB), shape "
            f"{result['shape']}, ranks {args.ranks}, solver {args.solver}, {result['threads']} threads: "
            f"{result['seconds']:.1f} s, peak {result['peak_over_table']:.2f}x the table, "
            f"error {result['relative_error_sampled']:.4f}"
        )
        print(json.dumps(result))
        return
    weight = smollm2_embedding().to(dtype)
    print(
        f"SmolLM2 embedding {tuple(weight.shape)} ({WEIGHTS_NOTE}); torch threads {torch.get_num_threads()}; "
        f"device {device}, {args.dtype}"
    )
    decomp = decomposition(weight, args.shape, args.ranks, min(args.loop_tokens, weight.shape[0]), device)
    layer = decomp.pop("layer")
    for solver, row in decomp["solvers"].items():
        print(
            f"decomposition, solver {solver}: {row['seconds']:.2f}s vs tensorly loop "
            f"{decomp['tensorly_loop_seconds']:.2f}s = {row['speedup']:.1f}x faster; error {row['error']:.5f} vs "
            f"{decomp['tensorly_error']:.5f} ({row['error_ratio']:.4f}x)"
        )
    look = lookup(weight, layer, args.lookup_ids, 3 * args.repeats, device)
    print(
        f"lookup of {look['ids']} ids: TT {look['tt_seconds'] * 1e3:.1f} ms vs nn.Embedding "
        f"{look['dense_seconds'] * 1e3:.1f} ms; median of {look['pairs']} paired ratios {look['ratio']:.2f}x"
    )
    if device.type == "cuda":
        head = tied_head_on_device(weight, layer, args.head_tokens, args.repeats, device)
        memory = (
            f"forward peak {head['tt']['peak_growth_mib']:.1f} vs {head['dense']['peak_growth_mib']:.1f} MiB allocated"
        )
    else:
        head = tied_head(weight, layer.float(), args.head_tokens, args.repeats)
        memory = f"process peak RSS {head['tt']['peak_rss_mib']:.0f} vs {head['dense']['peak_rss_mib']:.0f} MiB"
    print(
        f"tied output layer, {args.head_tokens} tokens: TT {head['tt']['seconds'] * 1e3:.1f} ms vs dense "
        f"{head['dense']['seconds'] * 1e3:.1f} ms = {head['time_ratio']:.2f}x; resident "
        f"{head['tt']['resident_mib']:.1f} vs {head['dense']['resident_mib']:.1f} MiB; {memory}"
    )
    print(
        json.dumps(
            {
                "shape": args.shape,
                "ranks": args.ranks,
                "weights": WEIGHTS_NOTE,
                "device": str(device),
                "dtype": args.dtype,
                "decomposition": decomp,
                "lookup": look,
                "tied_head": head,
            }
        )
    )


if __name__ == "__main__":
    main()
