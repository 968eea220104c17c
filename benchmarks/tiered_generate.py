"""Greedy ``generate()`` with SmolLM2-135M whose tied embedding is the best ≥4× option (``method="tiered"``: the
20,000 lowest token ids at int4, the rest at int3, groups of 64, output-aware rounding calibrated on the first 75 %
of Moby Dick), saved and loaded back with ``trust_remote_code=True``, against dense and against what a user would
pick instead: the embedding and output head quantized by torchao, int8 per row (``IntxWeightOnlyConfig``), through
transformers' ``TorchAoConfig``, saved and loaded back natively (``build_int8_checkpoint`` in ``tt_generate.py``:
the tied matrix becomes two int8 copies, embedding and head).

    OMP_NUM_THREADS=1 python benchmarks/tiered_generate.py [--threads 1] [--new-tokens 32] [--repeats 3]
        [--batch 1 8] [--options '{"tier_tokens": [2000], "tier_bits": [4, "codebook"], "rounding": "output"}']
        [--device cuda --dtype bf16] [--random]

``--options`` replaces the tiered arm's ``TieredConfig`` options (JSON; default ``OPTIONS``). ``--device cuda
--dtype bf16``: both checkpoints loaded onto the GPU in bf16, dense against tiered (the torchao and torch-path arms
are CPU comparisons and are left out), peak allocated GPU memory instead of RSS. ``--random``: a model of
SmolLM2-135M's config with random weights, calibrated on random ids, and SmolLM2's tokenizer (its ``config.json``
and tokenizer files are all it reads from the cache), for a machine that cannot hold the weights: it measures speed
and memory, not quality (greedy tokens of random weights say nothing).

1. decode time at each ``--batch`` (1 and 8: the tied head multiplies one or eight hidden states per step, a
   matrix-vector or a thin matrix product): one process holds the three models and runs them in turn within each repeat (paired
   runs); ratios are medians of the paired ratios to dense of wall time and of the process's CPU time;
   the tiered model is timed twice, its tied head on the fused CPU kernel (``runtime/lowbit_kernel.py``, the default
   where a C compiler and AVX2 are present) and on the torch path (``HF_TENSORCOMPRESS_KERNELS=0``);
2. peak RSS (VmHWM) of load + generate, each model in its own fresh process; the bytes the embedding and head hold
   in memory and in ``model.safetensors`` (a tied matrix once; torchao's codes, scales and zero points); and the
   tensors of ``V×d`` size or more each holds (the tiered model must hold none: lookups and the tied head decode
   rows a chunk at a time).
The last line printed is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import add_device_arguments, device_and_dtype  # noqa: E402
from tt_generate import (  # noqa: E402  (shared benchmark helpers)
    build_int8_checkpoint,
    embedding_head_bytes,
    generate,
    load,
    memory_status,
    run_child,
    stored_embedding_head_bytes,
    timed_both,
)

OPTIONS = dict(tier_tokens=[20000], tier_bits=[4, 3], tier_group_size=64, rounding="output")
ARMS = ("dense", "tiered", "torchao_int8")  # dense first: the reference of the paired ratios
#: Timed only: the tiered checkpoint with its head on the torch path (``HF_TENSORCOMPRESS_KERNELS=0``: decode a chunk,
#: then a GEMM) instead of the fused CPU kernel, to show what the kernel is worth.
TORCH_PATH = "tiered_torch_path"


def random_dense_checkpoint(folder: Path) -> Path:
    """Save into ``folder`` a model of SmolLM2-135M's config with random weights (seed 0) and SmolLM2's tokenizer,
    both read from the cached SmolLM2 folder, which need not hold the weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_tensorcompress.data.causal_lm import converted_smollm2_dir

    source = converted_smollm2_dir()
    if not (source / "config.json").exists() or not (source / "tokenizer.json").exists():
        raise SystemExit(f"--random needs SmolLM2's config.json and tokenizer files in {source}; run without it once")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def build_checkpoint(folder: Path, options: dict, dense: Path, random: bool) -> dict:
    """Compress the embedding of the model in ``dense`` with ``options`` and save it with its tokenizer into
    ``folder``: calibrated on Moby Dick's build split, or on random ids for a ``random`` model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_tensorcompress import CompressionConfig, apply_tiered, assets
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids

    tokenizer = AutoTokenizer.from_pretrained(dense)
    if random:
        calibration = torch.randint(0, len(tokenizer), (1, 4096), generator=torch.Generator().manual_seed(0))
    else:
        calibration = token_ids(tokenizer, split_documents(text_dataset(assets.moby_dick_dir()), 0.25)[0])
    model = AutoModelForCausalLM.from_pretrained(dense)
    start = time.perf_counter()
    apply_tiered(model, CompressionConfig(method="tiered", **options), calibration)
    seconds = time.perf_counter() - start
    embedding_bytes = model.get_input_embeddings().storage_bits() // 8
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {
        "dense_dir": str(dense),
        "compress_seconds": seconds,
        "embedding_bytes": embedding_bytes,
        "dense_bytes": (dense / "model.safetensors").stat().st_size,
        "tiered_bytes": (folder / "model.safetensors").stat().st_size,
    }


def memory_arm(folder: str, new_tokens: int, device: str, dtype: str) -> dict:
    """In a fresh process: load, generate at batch 1, report the peak memory (RSS, or allocated GPU memory), the
    embedding's and head's bytes held and stored, and the ``V×d``-sized tensors held."""
    model, tokenizer = load(folder, device, dtype)
    generate(model, tokenizer, 1, new_tokens)
    large = [
        name
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers())
        if tensor.numel() >= model.config.vocab_size * model.config.hidden_size
    ]
    return {
        "after_generate": memory_status(device),
        "embedding_head_bytes": embedding_head_bytes(model),
        "embedding_head_bytes_on_disk": stored_embedding_head_bytes(model, folder),
        "vocab_by_hidden_tensors": large,
    }


def timing(folders: dict[str, str], new_tokens: int, repeats: int, batches: list[int], device: str, dtype: str) -> dict:
    """Per batch size: all models in one process, run in turn within each repeat (the first is the reference:
    dense); per other arm, the median of its paired ratios to the reference and whether its greedy tokens equal the
    reference's."""
    models = {name: load(folder, device, dtype) for name, folder in folders.items()}
    tokenizer = next(iter(models.values()))[1]

    def run(name: str, model, batch: int, tokens: int):
        os.environ["HF_TENSORCOMPRESS_KERNELS"] = "0" if name == TORCH_PATH else "1"
        return generate(model, tokenizer, batch, tokens)

    for name, (model, _) in models.items():
        run(name, model, 1, 2)  # warm-up (and the kernel's one-time build)
    result = {}
    for batch in batches:
        times = {name: [] for name in models}
        for _ in range(repeats):
            for name, (model, _) in models.items():
                times[name].append(
                    timed_both(lambda name=name, model=model, batch=batch: run(name, model, batch, new_tokens))
                )
        tokens = {name: run(name, model, batch, new_tokens).tolist() for name, (model, _) in models.items()}
        reference, *others = models
        arms = {f"{name}_seconds": statistics.median(wall for wall, _ in times[name]) for name in models}
        for name in others:
            pairs = list(zip(times[reference], times[name]))
            arms[name] = {
                "over_dense": statistics.median(arm[0] / ref[0] for ref, arm in pairs),
                "over_dense_cpu": statistics.median(arm[1] / ref[1] for ref, arm in pairs),
                "pairs_wall": [(ref[0], arm[0]) for ref, arm in pairs],
                "greedy_tokens_equal_to_dense": tokens[name] == tokens[reference],
            }
        result[f"batch{batch}"] = arms
    kernels = [module.load_kernel() for name, module in sys.modules.items() if name.endswith(".lowbit_kernel")]
    result["fused_kernel_built"] = any(kernel is not None for kernel in kernels)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes of the timed generate()")
    parser.add_argument("--options", type=json.loads, default=OPTIONS, help="the tiered arm's options (JSON)")
    parser.add_argument("--random", action="store_true", help="random weights of SmolLM2's config (speed only)")
    add_device_arguments(parser)
    parser.add_argument("--child", choices=["memory", "timing"])
    parser.add_argument("--folder", nargs="*", help="for --child: one folder (memory) or one per arm (timing)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    device_and_dtype(args)
    on_cpu = torch.device(args.device).type == "cpu"
    arms = ARMS if on_cpu else ARMS[:2]  # torchao's int8 and the torch path are the CPU's alternatives
    if args.child == "memory":
        print(json.dumps(memory_arm(args.folder[0], args.new_tokens, args.device, args.dtype)))
        return
    if args.child == "timing":
        folders = dict(zip(arms, args.folder, strict=True))
        if on_cpu:
            folders[TORCH_PATH] = folders["tiered"]
        print(json.dumps(timing(folders, args.new_tokens, args.repeats, args.batch, args.device, args.dtype)))
        return
    common = ["--threads", str(args.threads), "--new-tokens", str(args.new_tokens), "--device", args.device]
    common += ["--dtype", args.dtype]
    timed_arms = (*arms[1:], TORCH_PATH) if on_cpu else arms[1:]
    with (
        tempfile.TemporaryDirectory() as tiered_dir,
        tempfile.TemporaryDirectory() as int8_dir,
        tempfile.TemporaryDirectory() as random_dir,
    ):
        from hf_tensorcompress.data.causal_lm import smollm2_dir

        dense_dir = random_dense_checkpoint(Path(random_dir)) if args.random else smollm2_dir()
        built = build_checkpoint(Path(tiered_dir), args.options, dense_dir, args.random)
        folders = {"dense": str(dense_dir), "tiered": tiered_dir}
        if on_cpu:
            start = time.perf_counter()
            build_int8_checkpoint(dense_dir, Path(int8_dir))
            built["torchao_int8_build_seconds"] = time.perf_counter() - start
            folders["torchao_int8"] = int8_dir
        checkpoint_mb = {
            name: (Path(folder) / "model.safetensors").stat().st_size / 1e6 for name, folder in folders.items()
        }
        memory = {name: run_child(["--child", "memory", "--folder", folders[name], *common], __file__) for name in arms}
        speed = run_child(
            [
                "--child",
                "timing",
                "--folder",
                *(folders[name] for name in arms),
                "--repeats",
                str(args.repeats),
                "--batch",
                *map(str, args.batch),
                *common,
            ],
            __file__,
        )
    peak = {name: arm["after_generate"]["peak_mb"] for name, arm in memory.items()}
    held_mb = {name: arm["embedding_head_bytes"] / 1e6 for name, arm in memory.items()}
    disk_mb = {name: arm["embedding_head_bytes_on_disk"] / 1e6 for name, arm in memory.items()}
    bf16_mb = 49152 * 576 * 2 / 1e6  # the tied matrix once, in bf16: the 1x of every size here (MB = 10^6 bytes)
    embedding_fp32_mb = 49152 * 576 * 4 / 2**20  # MiB, as the peak RSS
    model_name = "SmolLM2-135M's config with random weights" if args.random else "SmolLM2-135M"
    print(
        f"{model_name} on {args.device} in {args.dtype}, {args.threads} thread(s), {args.new_tokens} new tokens, "
        f"greedy, batch {args.batch}; tiered {args.options}: embedding {built['embedding_bytes'] / 1e6:.1f} MB "
        f"({49152 * 576 * 2 / built['embedding_bytes']:.2f}x smaller than bf16), compressed in "
        f"{built['compress_seconds']:.0f} s"
        + (f"; torchao int8 per row (embedding and head untied), built in {built['torchao_int8_build_seconds']:.0f} s"
           if on_cpu else "")
    )  # fmt: skip
    print(f"fused CPU kernel built: {speed['fused_kernel_built']}")
    for batch in args.batch:
        batch_arms = speed[f"batch{batch}"]
        print(f"decode, batch {batch}: dense {batch_arms['dense_seconds']:.2f} s")
        for name in timed_arms:
            arm = batch_arms[name]
            print(
                f"decode, batch {batch}: {name} {batch_arms[f'{name}_seconds']:.2f} s ({arm['over_dense']:.2f}x wall, "
                f"{arm['over_dense_cpu']:.2f}x CPU time); greedy tokens equal to dense: "
                f"{arm['greedy_tokens_equal_to_dense']}"
            )
    peak_name = "peak RSS" if on_cpu else "peak allocated GPU memory"
    for name in arms:
        print(
            f"{name}: {peak_name} {peak[name]:.0f} MB (dense - this: {peak['dense'] - peak[name]:+.0f} MB); embedding + "
            f"head held {held_mb[name]:.1f} MB, on disk {disk_mb[name]:.1f} MB ({bf16_mb / disk_mb[name]:.2f}x smaller "
            f"than bf16 tied); checkpoint {checkpoint_mb[name]:.0f} MB; V x d tensors held: "
            f"{memory[name]['vocab_by_hidden_tensors']}"
        )
    print(
        json.dumps(
            {
                "threads": args.threads,
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "options": args.options,
                "device": args.device,
                "dtype": args.dtype,
                "random_weights": args.random,
                "embedding_smaller_than_bf16": 49152 * 576 * 2 / built["embedding_bytes"],
                **{
                    f"{name}_over_dense{cpu}_batch{batch}": speed[f"batch{batch}"][name][f"over_dense{cpu}"]
                    for batch in args.batch
                    for name in timed_arms
                    for cpu in ("", "_cpu")
                },
                "fused_kernel_built": speed["fused_kernel_built"],
                "peak_mb": peak,
                "peak_measure": "VmHWM (peak RSS)" if on_cpu else "torch.cuda.max_memory_allocated",
                "peak_saving_mb": peak["dense"] - peak["tiered"],
                "peak_saving_over_fp32_embedding": (peak["dense"] - peak["tiered"]) / embedding_fp32_mb,
                **({"torchao_int8_peak_saving_mb": peak["dense"] - peak["torchao_int8"]} if on_cpu else {}),
                "embedding_head_held_mb": held_mb,
                "embedding_head_on_disk_mb": disk_mb,
                "checkpoint_mb": checkpoint_mb,
                "checkpoint_saving_mb": checkpoint_mb["dense"] - checkpoint_mb["tiered"],
                "details": {"timing": speed, "memory": memory, "build": built},
            }
        )
    )


if __name__ == "__main__":
    main()
