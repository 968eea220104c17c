"""Greedy ``generate()`` with a TT-compressed SmolLM2-135M, saved and loaded back as a user would, against dense.

    OMP_NUM_THREADS=1 python benchmarks/tt_generate.py [--threads 1] [--new-tokens 48] [--repeats 3]
    python benchmarks/tt_generate.py --device cuda --dtype bf16   # on a GPU: peak is max_memory_allocated

The TT checkpoint is the best training-free 2× option: output-aware basis, ranks 1,1 (8×8×9), the 21,500 most
frequent calibration tokens dense, calibrated on the first 75 % of Moby Dick. Both folders load with
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` (the TT one runs the layer code saved in
the folder). Printed side by side:

1. decode time, batch 1 and batch 8: one process holds both models and alternates the arms (dense, TT) per
   repeat, so both see the same machine load; ratios are medians of the paired ratios, of wall time and of the
   process's CPU time (with one thread, the steadier measure on a shared machine). The TT head in its
   default mode (``auto``: factored logits) and, once each, ``cached`` (one dense copy) and ``rebuild`` (the
   reference path, rows rebuilt per step).
2. greedy tokens of the default path against the reference path (batch 1 and 8) and the rows the head sees
   per call (transformers' ``logits_to_keep=1``).
3. peak RSS (VmHWM) of load + generate (batch 1 then 8), each arm in its own fresh process: dense, TT
   (default), TT cached.
The last line printed is one JSON object with all figures (``peak_mb``: VmHWM on the CPU,
``torch.cuda.max_memory_allocated`` on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import add_device_arguments

PROMPTS = [
    "The whale swam slowly toward the ship, and Ahab",
    "Call me Ishmael. Some years ago",
    "The state of our union is",
    "In the morning the harpooneers",
    "Write a short poem about the sea:",
    "The captain looked at the horizon and said",
    "Explain why the sky is blue.",
    "Once upon a time, in a small village,",
]
EXACT_TOKENS, RANKS, SHAPE = 21500, [1, 1], [8, 8, 9]


def build_checkpoint(folder: Path) -> dict:
    """Compress SmolLM2 (see the module docstring) and save it with its tokenizer into ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_tensorcompress import CompressionConfig, apply_tt, assets
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids

    dense = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(dense)
    calibration = token_ids(tokenizer, split_documents(text_dataset(assets.moby_dick_dir()), 0.25)[0])
    model = AutoModelForCausalLM.from_pretrained(dense)
    start = time.perf_counter()
    config = CompressionConfig(
        method="tt", tt_shape=SHAPE, tt_ranks=RANKS, tt_basis="output", tt_exact_tokens=EXACT_TOKENS
    )
    apply_tt(model, config, calibration)
    seconds = time.perf_counter() - start
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {
        "dense_dir": str(dense),
        "compress_seconds": seconds,
        "tt_solver": config.tt_solver,
        "dense_bytes": (dense / "model.safetensors").stat().st_size,
        "tt_bytes": (folder / "model.safetensors").stat().st_size,
    }


def load(folder: str, device: str = "cpu", dtype: str = "fp32"):
    from timing import DTYPES
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).to(device, DTYPES[dtype]).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def generate(model, tokenizer, batch: int, new_tokens: int):
    inputs = tokenizer(PROMPTS[:batch], return_tensors="pt", padding=True).to(model.device)
    return model.generate(
        **inputs,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )


def synchronize() -> None:
    """Wait for queued GPU work (a no-op on the CPU), so wall times cover it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def timed_both(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): on a shared machine the CPU time of a one-thread run is the
    steadier measure of the work done, the wall time what a user waits."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def build_int8_checkpoint(dense: Path, folder: Path) -> None:
    """Save into ``folder`` the model in ``dense`` with its tied embedding and output head quantized by torchao,
    int8 per row, through transformers' torchao integration, as a user would.

    In transformers 5.24 / torchao 0.18 on the CPU the one-call route (``TorchAoConfig(IntxWeightOnlyConfig(...),
    include_input_output_embeddings=True, untie_embedding_weights=True)``) leaves the embedding in float (its
    ``quantize_`` call keeps the default Linear filter) and the untied head in fp32; with per-module configs
    (``FqnToConfig``) it quantizes the embedding but the head stays fp32 (its weight is not in a tied
    checkpoint). So the tied matrix is first written as two float copies (an untied checkpoint, as
    ``tie_word_embeddings=False`` models ship), then loaded with ``FqnToConfig`` for both: two int8 copies."""
    import torch
    from torchao.quantization import FqnToConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    tokenizer = AutoTokenizer.from_pretrained(dense)
    with tempfile.TemporaryDirectory() as untied:
        model = AutoModelForCausalLM.from_pretrained(dense)
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        head.weight = torch.nn.Parameter(embedding.weight.detach().clone())
        model.config.tie_word_embeddings = False
        model.save_pretrained(untied)
        names = [name for name, module in model.named_modules() if module is embedding or module is head]
        del model, embedding, head
        int8 = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
        config = TorchAoConfig(FqnToConfig(dict.fromkeys(names, int8)), include_input_output_embeddings=True)
        AutoModelForCausalLM.from_pretrained(untied, quantization_config=config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def embedding_head_bytes(model) -> int:
    """Bytes the input embedding and the output head hold in memory (``held_bytes``)."""
    return held_bytes(model.get_input_embeddings(), model.get_output_embeddings())


def held_bytes(*modules) -> int:
    """Bytes the parameters and buffers of ``modules`` hold in memory, each storage once (a tied matrix counts once;
    a torchao weight as its codes, scales and zero points)."""
    seen, total = set(), 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            data = tensor.data
            parts = (
                [getattr(data, name) for name in data.__tensor_flatten__()[0]]
                if hasattr(data, "__tensor_flatten__")
                else [data]
            )
            for part in parts:
                key = (part.untyped_storage().data_ptr(), part.data_ptr(), part.numel())
                if key not in seen:
                    seen.add(key)
                    total += part.numel() * part.element_size()
    return total


def stored_embedding_head_bytes(model, folder: str) -> int:
    """Bytes of the input embedding's and output head's tensors in ``folder``'s ``model.safetensors``."""
    modules = (model.get_input_embeddings(), model.get_output_embeddings())
    prefixes = tuple(f"{name}." for name, module in model.named_modules() if any(module is m for m in modules))
    with open(Path(folder) / "model.safetensors", "rb") as file:  # the header: 8-byte length, then JSON
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    header.pop("__metadata__", None)
    return sum(
        entry["data_offsets"][1] - entry["data_offsets"][0] for key, entry in header.items() if key.startswith(prefixes)
    )


def memory_status(device: str = "cpu") -> dict:
    """VmHWM (peak RSS), RssAnon and RssFile in MB from /proc/self/status, and ``peak_mb``: VmHWM on the CPU, the
    peak allocated GPU memory on a GPU."""
    import torch

    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    on_gpu = device.startswith("cuda")
    fields["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20 if on_gpu else fields["VmHWM"]
    return fields


def memory_arm(folder: str, mode: str | None, new_tokens: int, device: str, dtype: str) -> dict:
    """Run in a fresh process: load, generate at batch 1 and 8, report the peak memory."""
    model, tokenizer = load(folder, device, dtype)
    after_load = memory_status(device)
    if mode is not None:
        model.get_output_embeddings().mode = mode
    for batch in (1, 8):
        generate(model, tokenizer, batch, new_tokens)
    large = [
        name
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers())
        if tensor.numel() >= model.config.vocab_size * model.config.hidden_size
    ]
    return {"after_load": after_load, "after_generate": memory_status(device), "vocab_by_hidden_tensors": large}


def timing(dense_dir: str, tt_dir: str, new_tokens: int, repeats: int, device: str, dtype: str) -> dict:
    """Both models in one process, arms alternating per repeat (see the module docstring)."""
    import torch

    dense, tokenizer = load(dense_dir, device, dtype)
    tt, _ = load(tt_dir, device, dtype)
    head = tt.get_output_embeddings()
    rows = []
    head.register_forward_hook(lambda module, args, out: rows.append(tuple(args[0].shape)))
    results = {}
    for batch in (1, 8):
        generate(dense, tokenizer, batch, 2), generate(tt, tokenizer, batch, 2)  # warm-up
        pairs, cpu_pairs = [], []
        for _ in range(repeats):
            (dense_wall, dense_cpu), (tt_wall, tt_cpu) = (
                timed_both(lambda batch=batch: generate(dense, tokenizer, batch, new_tokens)),
                timed_both(lambda batch=batch: generate(tt, tokenizer, batch, new_tokens)),
            )
            pairs.append((dense_wall, tt_wall))
            cpu_pairs.append((dense_cpu, tt_cpu))
        rows.clear()
        fast = generate(tt, tokenizer, batch, new_tokens)
        head_rows = sorted(set(rows))
        head.mode = "rebuild"
        start = time.perf_counter()
        reference = generate(tt, tokenizer, batch, new_tokens)
        reference_seconds = time.perf_counter() - start
        head.mode = "cached"
        generate(tt, tokenizer, batch, 2)  # builds the copy once
        cached_seconds = timed(lambda batch=batch: generate(tt, tokenizer, batch, new_tokens))
        head.mode, head._cache = "auto", None
        dense_median = statistics.median(d for d, _ in pairs)
        results[f"batch{batch}"] = {
            "dense_seconds": dense_median,
            "tt_seconds": statistics.median(t for _, t in pairs),
            "tt_over_dense": statistics.median(t / d for d, t in pairs),
            "tt_over_dense_cpu": statistics.median(t / d for d, t in cpu_pairs),
            "pairs_wall": pairs,
            "tt_cached_over_dense": cached_seconds / dense_median,
            "tt_reference_over_dense": reference_seconds / dense_median,
            "greedy_tokens_equal_to_reference": bool(torch.equal(fast, reference)),
            "head_input_shapes": head_rows[:4],
        }
    return results


def run_child(args: list[str], script: str = __file__) -> dict:
    """``script`` (this one by default) in a fresh process; its last stdout line is JSON."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=os.environ)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["memory", "timing"])
    parser.add_argument("--folder", nargs="*")
    parser.add_argument("--mode", default=None)
    add_device_arguments(parser)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child == "memory":
        print(json.dumps(memory_arm(args.folder[0], args.mode, args.new_tokens, args.device, args.dtype)))
        return
    if args.child == "timing":
        print(
            json.dumps(timing(args.folder[0], args.folder[1], args.new_tokens, args.repeats, args.device, args.dtype))
        )
        return
    common = [
        "--threads",
        str(args.threads),
        "--new-tokens",
        str(args.new_tokens),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        built = build_checkpoint(Path(tmp))
        dense_dir, tt_dir = built["dense_dir"], tmp
        memory = {}
        for name, folder, mode in (("dense", dense_dir, None), ("tt", tt_dir, None), ("tt_cached", tt_dir, "cached")):
            memory[name] = run_child(
                ["--child", "memory", "--folder", folder, *common] + ([] if mode is None else ["--mode", mode])
            )
        speed = run_child(["--child", "timing", "--folder", dense_dir, tt_dir, "--repeats", str(args.repeats), *common])
    peak = {name: arm["after_generate"]["peak_mb"] for name, arm in memory.items()}
    embedding_mb = 49152 * 576 * 4 / 2**20
    print(
        f"SmolLM2-135M, {args.threads} thread(s), {args.new_tokens} new tokens, greedy; TT: ranks {RANKS}, "
        f"output basis, {EXACT_TOKENS} exact tokens; checkpoints {built['dense_bytes'] / 2**20:.0f} MB dense, "
        f"{built['tt_bytes'] / 2**20:.0f} MB TT (compressed in {built['compress_seconds']:.1f} s, "
        f"solver {built['tt_solver']})"
    )
    for batch in ("batch1", "batch8"):
        row = speed[batch]
        print(
            f"{batch}: dense {row['dense_seconds']:.2f} s, TT {row['tt_seconds']:.2f} s "
            f"({row['tt_over_dense']:.2f}x; CPU time {row['tt_over_dense_cpu']:.2f}x); cached {row['tt_cached_over_dense']:.2f}x, reference "
            f"{row['tt_reference_over_dense']:.2f}x; greedy tokens equal to reference: "
            f"{row['greedy_tokens_equal_to_reference']}; head input {row['head_input_shapes']}"
        )
    for name, value in peak.items():
        print(
            f"peak memory load+generate {name}: {value:.0f} MB (dense - this: {peak['dense'] - value:+.0f} MB; "
            f"V x d tensors held: {memory[name]['vocab_by_hidden_tensors']})"
        )
    print(
        json.dumps(
            {
                "threads": args.threads,
                "device": args.device,
                "dtype": args.dtype,
                "new_tokens": args.new_tokens,
                "tt_over_dense_batch1": speed["batch1"]["tt_over_dense"],
                "tt_over_dense_batch8": speed["batch8"]["tt_over_dense"],
                "tt_over_dense_cpu_batch1": speed["batch1"]["tt_over_dense_cpu"],
                "tt_over_dense_cpu_batch8": speed["batch8"]["tt_over_dense_cpu"],
                "tt_cached_over_dense_batch1": speed["batch1"]["tt_cached_over_dense"],
                "tt_reference_over_dense_batch1": speed["batch1"]["tt_reference_over_dense"],
                "greedy_equal_batch1": speed["batch1"]["greedy_tokens_equal_to_reference"],
                "greedy_equal_batch8": speed["batch8"]["greedy_tokens_equal_to_reference"],
                "peak_mb": peak,
                "peak_saving_mb": peak["dense"] - peak["tt"],
                "peak_saving_over_embedding": (peak["dense"] - peak["tt"]) / embedding_mb,
                "cached_extra_mb": peak["tt_cached"] - peak["tt"],
                "checkpoint_saving_mb": (built["dense_bytes"] - built["tt_bytes"]) / 2**20,
                "details": {"timing": speed, "memory": memory},
            }
        )
    )


if __name__ == "__main__":
    main()
