"""Greedy ``generate()`` with SmolLM2-135M whose tied embedding is the best ≥4× option (``method="tiered"``: the
20,000 lowest token ids at int4, the rest at int3, groups of 64, output-aware rounding calibrated on the first 75 %
of Moby Dick), saved and loaded back with ``trust_remote_code=True``, against dense.

    OMP_NUM_THREADS=1 python benchmarks/tiered_generate.py [--threads 1] [--new-tokens 32] [--repeats 3]

1. decode time at batch 1: one process holds both models and alternates them per repeat (paired runs); ratios are
   medians of the paired ratios of wall time and of the process's CPU time;
2. peak RSS (VmHWM) of load + generate, each model in its own fresh process, and the tensors of ``V×d`` size or
   more each holds (the tiered model must hold none: lookups and the tied head decode rows a chunk at a time).
The last line printed is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tt_generate import generate, load, memory_status, run_child, timed_both  # noqa: E402  (shared benchmark helpers)

OPTIONS = dict(tier_tokens=[20000], tier_bits=[4, 3], tier_group_size=64, rounding="output")


def build_checkpoint(folder: Path) -> dict:
    """Compress SmolLM2's embedding (module docstring) and save it with its tokenizer into ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_tensorcompress import CompressionConfig, assets
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
    from hf_tensorcompress.methods.tiered.apply import apply_tiered

    dense = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(dense)
    calibration = token_ids(tokenizer, split_documents(text_dataset(assets.moby_dick_dir()), 0.25)[0])
    model = AutoModelForCausalLM.from_pretrained(dense)
    start = time.perf_counter()
    apply_tiered(model, CompressionConfig(method="tiered", **OPTIONS), calibration)
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


def memory_arm(folder: str, new_tokens: int) -> dict:
    """In a fresh process: load, generate at batch 1, report the peak RSS and the ``V×d``-sized tensors held."""
    model, tokenizer = load(folder)
    generate(model, tokenizer, 1, new_tokens)
    large = [
        name
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers())
        if tensor.numel() >= model.config.vocab_size * model.config.hidden_size
    ]
    return {"after_generate": memory_status(), "vocab_by_hidden_tensors": large}


def timing(dense_dir: str, tiered_dir: str, new_tokens: int, repeats: int) -> dict:
    """Both models in one process, alternating per repeat; also whether their greedy tokens agree."""
    dense, tokenizer = load(dense_dir)
    tiered, _ = load(tiered_dir)
    generate(dense, tokenizer, 1, 2), generate(tiered, tokenizer, 1, 2)  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        dense_wall, dense_cpu = timed_both(lambda: generate(dense, tokenizer, 1, new_tokens))
        tiered_wall, tiered_cpu = timed_both(lambda: generate(tiered, tokenizer, 1, new_tokens))
        walls.append((dense_wall, tiered_wall))
        cpus.append((dense_cpu, tiered_cpu))
    same = generate(dense, tokenizer, 1, new_tokens).tolist() == generate(tiered, tokenizer, 1, new_tokens).tolist()
    return {
        "dense_seconds": statistics.median(d for d, _ in walls),
        "tiered_seconds": statistics.median(t for _, t in walls),
        "tiered_over_dense": statistics.median(t / d for d, t in walls),
        "tiered_over_dense_cpu": statistics.median(t / d for d, t in cpus),
        "pairs_wall": walls,
        "greedy_tokens_equal_to_dense": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["memory", "timing"])
    parser.add_argument("--folder", nargs="*")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child == "memory":
        print(json.dumps(memory_arm(args.folder[0], args.new_tokens)))
        return
    if args.child == "timing":
        print(json.dumps(timing(args.folder[0], args.folder[1], args.new_tokens, args.repeats)))
        return
    common = ["--threads", str(args.threads), "--new-tokens", str(args.new_tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        built = build_checkpoint(Path(tmp))
        memory = {
            name: run_child(["--child", "memory", "--folder", folder, *common], __file__)
            for name, folder in (("dense", built["dense_dir"]), ("tiered", tmp))
        }
        speed = run_child(
            ["--child", "timing", "--folder", built["dense_dir"], tmp, "--repeats", str(args.repeats), *common],
            __file__,
        )
    peak = {name: arm["after_generate"]["VmHWM"] for name, arm in memory.items()}
    embedding_fp32_mb = 49152 * 576 * 4 / 2**20
    print(
        f"SmolLM2-135M, {args.threads} thread(s), {args.new_tokens} new tokens, greedy, batch 1; tiered "
        f"{OPTIONS}: embedding {built['embedding_bytes'] / 2**20:.1f} MB ({49152 * 576 * 2 / built['embedding_bytes']:.2f}x "
        f"smaller than bf16), compressed in {built['compress_seconds']:.0f} s"
    )
    print(
        f"decode: dense {speed['dense_seconds']:.2f} s, tiered {speed['tiered_seconds']:.2f} s "
        f"({speed['tiered_over_dense']:.2f}x wall, {speed['tiered_over_dense_cpu']:.2f}x CPU time); greedy tokens "
        f"equal to dense: {speed['greedy_tokens_equal_to_dense']}"
    )
    print(
        f"peak RSS: dense {peak['dense']:.0f} MB, tiered {peak['tiered']:.0f} MB (saving "
        f"{peak['dense'] - peak['tiered']:.0f} MB = {(peak['dense'] - peak['tiered']) / embedding_fp32_mb:.0%} of "
        f"the fp32 embedding); V x d tensors held: {memory['tiered']['vocab_by_hidden_tensors']}"
    )
    print(
        json.dumps(
            {
                "threads": args.threads,
                "new_tokens": args.new_tokens,
                "options": OPTIONS,
                "embedding_smaller_than_bf16": 49152 * 576 * 2 / built["embedding_bytes"],
                "tiered_over_dense_batch1": speed["tiered_over_dense"],
                "tiered_over_dense_cpu_batch1": speed["tiered_over_dense_cpu"],
                "peak_rss_mb": peak,
                "peak_saving_mb": peak["dense"] - peak["tiered"],
                "peak_saving_over_fp32_embedding": (peak["dense"] - peak["tiered"]) / embedding_fp32_mb,
                "checkpoint_saving_mb": (built["dense_bytes"] - built["tiered_bytes"]) / 2**20,
                "details": {"timing": speed, "memory": memory, "build": built},
            }
        )
    )


if __name__ == "__main__":
    main()
