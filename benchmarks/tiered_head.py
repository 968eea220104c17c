"""The tied head product alone at batch 1 — one hidden vector → 49,152 logits — of the tiered embedding's options
against the dense fp32 and bf16 heads (``F.linear``), with this machine's measured memory bandwidth.

    OMP_NUM_THREADS=2 python benchmarks/tiered_head.py [--random] [--threads 1 2] [--repeats 200]
        [--arms budget-4x budget-6x budget-8x budget-10x fixed-4x fixed-6x] [--device cuda]

Arms (``ARMS``): ``budget-Nx`` is ``size_ratio=N`` (rows of several widths, allocated by measured sensitivity; at 8×
and 10× most rows are 1- to 2-bit codebook rows of 8- and 4-vectors);
``fixed-4x`` / ``fixed-6x`` are the fixed options of those sizes (the 20,000 lowest ids at int4 and the rest int3;
the 2,000 lowest at int4 and the rest codebook). All use output-aware rounding, calibrated as the other benchmarks
do: the first ``--calibration-tokens`` tokens of the Moby Dick build split. This benchmark measures speed and
bytes, not quality (a short calibration text changes which rows get which width, not how fast a width is read);
quality is in ``recipes/tensorslm_domains.py``'s results. ``--random``: a random model of SmolLM2's shapes (one
layer, N(0, 1) embedding, random calibration ids) for a machine without the assets.

Per arm and thread count: the median of ``--repeats`` timings of one product, arms interleaved within every repeat
(in a rotating order, so drift and noise hit all); the bytes the product reads (the stored table: packed codes,
scales, codebook and the 4-byte token→row map; ``V×d×4`` / ``×2`` for the dense heads) and the time those bytes take
at the measured bandwidth (``torch.sum`` over a 256 MiB float32 tensor, median of 9, at the same thread count).
On the CPU the tiered head runs the fused C kernel (``runtime/lowbit_kernel.py``) where it builds. ``--device cuda``:
dense fp32 and bf16 against the tiered layer in bf16 on the GPU (whatever path it takes there: the chunked decode
and GEMM), timed with CUDA events; each tiered arm is timed again as ``<arm>@1024rows``, decoding 1,024-row chunks as
on the CPU instead of the GPU's ``ACCELERATOR_CHUNK_BYTES``, to show what the chunk size is worth there. The last
line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import seconds  # noqa: E402  (shared benchmark helper)

VOCAB, HIDDEN = 49152, 576
ARMS = {
    "budget-4x": {"size_ratio": 4},
    "budget-6x": {"size_ratio": 6},
    "budget-8x": {"size_ratio": 8},
    "budget-10x": {"size_ratio": 10},
    "fixed-4x": {"tier_tokens": [20000], "tier_bits": [4, 3], "tier_group_size": 64},
    "fixed-6x": {"tier_tokens": [2000], "tier_bits": [4, "codebook"]},
}
#: The issue's targets: (arm, least dense-fp32 / arm time ratio).
TARGETS = {"budget-4x": 2.0, "budget-6x": 1.0, "budget-8x": 1.0}
BANDWIDTH_BYTES = 256 * 2**20


def base_model(random: bool, tokens: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """(a fresh model, its calibration ids): SmolLM2-135M from the cached assets, or a random one of its shapes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    if random:
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=1536,
            num_hidden_layers=1,
            num_attention_heads=9,
            num_key_value_heads=3,
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        torch.nn.init.normal_(model.get_input_embeddings().weight)
        return model, torch.randint(0, VOCAB, (1, tokens))
    from hf_tensorcompress import assets
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids

    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = token_ids(tokenizer, split_documents(text_dataset(assets.moby_dick_dir()), 0.25)[0], tokens)
    return AutoModelForCausalLM.from_pretrained(folder), ids


def build_arm(options: dict, random: bool, calibration_tokens: int) -> tuple[torch.nn.Module, torch.Tensor, float]:
    """(the tiered embedding of ``options``, the dense embedding matrix it replaced, build seconds)."""
    from hf_tensorcompress import CompressionConfig, apply_tiered

    model, ids = base_model(random, calibration_tokens)
    dense = model.get_input_embeddings().weight.detach().clone()
    start = time.perf_counter()
    apply_tiered(model, CompressionConfig(method="tiered", rounding="output", **options), ids)
    return model.get_input_embeddings(), dense, time.perf_counter() - start


def bandwidth(device: torch.device, repeats: int = 9) -> float:
    """Read bandwidth in bytes/s: ``torch.sum`` over a 256 MiB float32 tensor (larger than any cache), median."""
    data = torch.ones(BANDWIDTH_BYTES // 4, device=device)
    data.sum()
    return BANDWIDTH_BYTES / statistics.median(seconds(data.sum, device) for _ in range(repeats))


def in_cpu_sized_chunks(product: Callable[[], object]) -> object:
    """``product()`` with the GPU's decoding chunk cut to the CPU's ``CPU_CHUNK_ROWS`` rows (restored after)."""
    from hf_tensorcompress.runtime import lowbit

    saved = lowbit.ACCELERATOR_CHUNK_BYTES
    lowbit.ACCELERATOR_CHUNK_BYTES = lowbit.CPU_CHUNK_ROWS * HIDDEN * 2  # rows of bf16
    try:
        return product()
    finally:
        lowbit.ACCELERATOR_CHUNK_BYTES = saved


def interleaved(products: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds of each product, all run once per repeat in a rotating order."""
    names = list(products)
    for name in names:
        products[name]()
    times = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            times[name].append(seconds(products[name], device))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random", action="store_true", help="a random model of SmolLM2's shapes (no assets)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads (CPU)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--calibration-tokens", type=int, default=4096)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device is visible on this machine; use --device cpu")
    layers, build_seconds, stored = {}, {}, {}
    dense = None
    for name in args.arms:
        layer, dense, build_seconds[name] = build_arm(ARMS[name], args.random, args.calibration_tokens)
        stored[name] = layer.storage_bits() // 8
        layers[name] = layer.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
        print(
            f"{name}: {ARMS[name]}: {stored[name]:,} bytes ({VOCAB * HIDDEN * 2 / stored[name]:.2f}x smaller than bf16), built in {build_seconds[name]:.0f} s ({layer.extra_repr()})"
        )
    fp32 = dense.to(device, torch.float32)
    bf16 = dense.to(device, torch.bfloat16)
    hidden = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(0)).to(device)
    hidden_bf16 = hidden.to(torch.bfloat16)
    arm_hidden = hidden_bf16 if device.type == "cuda" else hidden
    read = {"dense-fp32": VOCAB * HIDDEN * 4, "dense-bf16": VOCAB * HIDDEN * 2, **stored}
    runs = []
    for threads in args.threads if device.type == "cpu" else [None]:
        if threads is not None:
            torch.set_num_threads(threads)
        with torch.no_grad():
            products = {
                "dense-fp32": lambda: F.linear(hidden, fp32),
                "dense-bf16": lambda: F.linear(hidden_bf16, bf16),
                **{name: (lambda layer=layer: layer.logits(arm_hidden)) for name, layer in layers.items()},
            }
            if device.type == "cuda":
                for name, layer in layers.items():
                    products[f"{name}@1024rows"] = lambda layer=layer: in_cpu_sized_chunks(
                        lambda: layer.logits(arm_hidden)
                    )
                    read[f"{name}@1024rows"] = stored[name]
            measured = bandwidth(device)
            times = interleaved(products, device, args.repeats)
        run = {"threads": threads, "bandwidth_gb_s": measured / 1e9, "arms": {}}
        for name, value in times.items():
            run["arms"][name] = {
                "ms": value * 1e3,
                "fp32_over_arm": times["dense-fp32"] / value,
                "bytes_read": read[name],
                "ms_at_bandwidth": read[name] / measured * 1e3,
            }
        runs.append(run)
        print(f"{device} threads={threads}: read bandwidth {measured / 1e9:.1f} GB/s (torch.sum, 256 MiB fp32)")
        print("| arm | bytes read | ms at that bandwidth | measured ms | dense fp32 / arm |")
        print("|---|---|---|---|---|")
        for name, arm in run["arms"].items():
            print(
                f"| {name} | {arm['bytes_read']:,} | {arm['ms_at_bandwidth']:.2f} | {arm['ms']:.2f} | "
                f"{arm['fp32_over_arm']:.2f}x |"
            )
    targets = {
        f"{name}_threads{run['threads']}": {
            "fp32_over_arm": run["arms"][name]["fp32_over_arm"],
            "target": least,
            "met": run["arms"][name]["fp32_over_arm"] >= least,
        }
        for run in runs
        for name, least in TARGETS.items()
        if name in layers
    }
    for key, target in targets.items():
        print(f"target {key}: dense fp32 / arm {target['fp32_over_arm']:.2f}x >= {target['target']}x: {target['met']}")
    kernels = [module.load_kernel() for name, module in sys.modules.items() if name.endswith(".lowbit_kernel")]
    print(
        json.dumps(
            {
                "device": str(device),
                "random": args.random,
                "vocab": VOCAB,
                "hidden": HIDDEN,
                "repeats": args.repeats,
                "calibration_tokens": args.calibration_tokens,
                "options": {name: ARMS[name] for name in args.arms},
                "stored_bytes": stored,
                "build_seconds": build_seconds,
                "fused_kernel_built": any(kernel is not None for kernel in kernels),
                "runs": runs,
                "targets": targets,
            }
        )
    )


if __name__ == "__main__":
    main()
