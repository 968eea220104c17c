"""ONNX Runtime deployment of compressed checkpoints: bytes, latency and peak RSS of the exported files against the
dense ONNX export, ONNX Runtime's own 4-bit weight quantization of that export (``MatMul4BitsQuantizer``:
``MatMulNBits``, block 32) and the same checkpoints in PyTorch.

    nice -n 5 python benchmarks/onnx_runtime.py [--work DIR] [--repeats 5] [--decode-tokens 16]

Models: SmolLM2-135M-Instruct with the README's 6× tiered embedding (``tier_tokens=[2000], tier_bits=[4,
"codebook"]``), the fixed 4× one (20,000 ids int4, the rest int3) and an all-int4 one (groups of 64), nearest
rounding (no calibration pass); a
PatchTST forecaster (context 336, 7 channels, d_model 128, 3 layers, random weights) with CP attention and 4-bit
factors at rank 0.25 (25-31 columns: no block ONNX Runtime's kernels take) and at rank 32 (groups of 32: on
``MatMulNBits``). Each compressed model is exported twice: ``*_ortops`` with ``export_onnx(ort_ops=True)`` (the
default: stored codes on ONNX Runtime's contrib ops where they map), ``*_standard`` with standard ops only. Every arm
runs in a fresh process (peak RSS is that process's VmHWM after load and the timed runs); ``*_nofold`` arms load the
file with ONNX Runtime's constant folding off, so the packed tensors stay packed in memory too; ``*_acc4`` files
compute their 4-bit products with int8 activations (``export_onnx(accuracy_level=4)``; the ``ort_int4_acc4``
baseline likewise). The paired decode comparison loads dense and the 4× and all-int4 files (both accuracy levels) in
one process and times them in turn, round after round, for ratios that the drift between processes does not move.
The greedy check
decodes 32 tokens with each exported LM and its PyTorch checkpoint. The last line printed is one JSON object with all
figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPT_TOKENS, FORECAST_BATCHES, THREADS = 128, (1, 32), (1, 2)
TIERED = dict(method="tiered", tier_tokens=[2000], tier_bits=[4, "codebook"])
PATCHTST = dict(
    num_input_channels=7,
    context_length=336,
    prediction_length=96,
    patch_length=16,
    patch_stride=8,
    d_model=128,
    num_attention_heads=16,
    num_hidden_layers=3,
    ffn_dim=256,
)
CP = dict(method="cp", rank=0.25, factor_bits=4, cp_iterations=10)
#: the fixed 4× tiered option (20,000 ids at int4, the rest int3) and a CP rank whose 4-bit factors ONNX Runtime's
#: ``MatMulNBits`` takes (rank 32 in groups of 32; rank 0.25 gives 25-31 columns in one group: no block of 2^k ≥ 16)
TIERED_4X = dict(method="tiered", tier_tokens=[20000], tier_bits=[4, 3], tier_group_size=64)
#: every row at int4 in groups of 64 (3.5× smaller than bf16 with its scales): the whole tied head on ``MatMulNBits``
TIERED_INT4 = dict(method="tiered", tier_tokens=[2000], tier_bits=[4, 4], tier_group_size=64)
CP_R32 = dict(method="cp", rank=32, factor_bits=4, factor_group_size=32, cp_iterations=10)
#: exported file → (the folder it comes from, ``export_onnx(ort_ops=..., accuracy_level=...)``); ``*_acc4``: the
#: 4-bit products with int8 activations (``MatMulNBits`` accuracy level 4)
EXPORTS = {
    "lm_dense": ("lm_dense", True, 0),
    "lm_tiered_standard": ("lm_tiered", False, 0),
    "lm_tiered_ortops": ("lm_tiered", True, 0),
    "lm_tiered4x_standard": ("lm_tiered4x", False, 0),
    "lm_tiered4x_ortops": ("lm_tiered4x", True, 0),
    "lm_tiered4x_acc4": ("lm_tiered4x", True, 4),
    "lm_tieredint4_ortops": ("lm_tieredint4", True, 0),
    "lm_tieredint4_acc4": ("lm_tieredint4", True, 4),
    "ts_dense": ("ts_dense", True, 0),
    "ts_cp_standard": ("ts_cp", False, 0),
    "ts_cp_ortops": ("ts_cp", True, 0),
    "ts_cpr32_standard": ("ts_cpr32", False, 0),
    "ts_cpr32_ortops": ("ts_cpr32", True, 0),
    "ts_cpr32_acc4": ("ts_cpr32", True, 4),
}


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def median_seconds(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------------ build
def quantize_linears(source: Path, target: Path, accuracy_level: int, gather: bool = False) -> None:
    """ONNX Runtime's 4-bit weight quantization (block 32) of every MatMul with an initializer weight (and with
    ``gather``, of every ``Gather`` of one: the embedding); the file keeps ``source``'s metadata."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger().setLevel(logging.WARNING)  # the quantizer's import set INFO: a line for every node
    ops = {"op_types_to_quantize": ("MatMul", "Gather"), "quant_axes": (("MatMul", 0), ("Gather", 1))}
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), block_size=32, accuracy_level=accuracy_level, **(ops if gather else {})
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))


def optimized(source: Path, target: Path) -> None:
    """``source`` after ONNX Runtime's basic optimizations (the tied head's ``Transpose`` folded into its own
    initializer), with the exported file's metadata."""
    import onnxruntime as ort

    from hf_tensorcompress.deploy.onnx.metadata import read_metadata, write_metadata

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    write_metadata(target, read_metadata(source))


def build(work: Path) -> dict:
    """Checkpoints and ONNX files of every arm (made once in ``work``)."""
    import torch
    from transformers import AutoTokenizer, PatchTSTConfig, PatchTSTForPrediction

    from hf_tensorcompress import CompressionConfig, apply_compression, load_model
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.deploy.onnx import export_onnx

    work.mkdir(parents=True, exist_ok=True)
    files = {"lm_dense_folder": smollm2_dir()}
    for name, options, folder in (
        ("lm_tiered", TIERED, "smollm2-tiered"),
        ("lm_tiered4x", TIERED_4X, "smollm2-tiered-4x"),
        ("lm_tieredint4", TIERED_INT4, "smollm2-tiered-int4"),
    ):
        files[f"{name}_folder"] = work / folder
        if not (files[f"{name}_folder"] / "config.json").exists():
            model = load_model(files["lm_dense_folder"]).float()
            apply_compression(model, CompressionConfig(**options))
            model.save_pretrained(files[f"{name}_folder"])
            AutoTokenizer.from_pretrained(files["lm_dense_folder"]).save_pretrained(files[f"{name}_folder"])
    files["ts_dense_folder"] = work / "patchtst-dense"
    for name, options, folder in (("ts_cp", CP, "patchtst-cp-int4"), ("ts_cpr32", CP_R32, "patchtst-cp-r32-int4")):
        files[f"{name}_folder"] = work / folder
        if not (files[f"{name}_folder"] / "config.json").exists():
            torch.manual_seed(0)
            model = PatchTSTForPrediction(PatchTSTConfig(**PATCHTST)).eval()
            model.save_pretrained(files["ts_dense_folder"])  # the same seeded dense model for both
            apply_compression(model, CompressionConfig(**options))
            model.save_pretrained(files[f"{name}_folder"])
    for name, (folder, ort_ops, accuracy_level) in EXPORTS.items():
        target = work / f"{name.replace('_', '-')}.onnx"
        if not target.exists():
            export_onnx(files[f"{folder}_folder"], target, ort_ops=ort_ops, accuracy_level=accuracy_level)
        files[f"{name}_onnx"] = target
    for family in ("lm", "ts"):
        folded = work / f"{family}-dense-folded.onnx"
        if not folded.exists():  # the exporter's MatMuls read Transpose(W): folded into W's initializer
            optimized(work / f"{family}-dense.onnx", folded)
        for suffix, accuracy_level in (("", 0), ("_acc4", 4)):
            quantized = work / f"{family}-ort-int4{suffix.replace('_', '-')}.onnx"
            if not quantized.exists():
                quantize_linears(folded, quantized, accuracy_level)
            files[f"{family}_ort_int4{suffix}_onnx"] = quantized
    return {key: str(value) for key, value in files.items()}


# ------------------------------------------------------------------------------------------------------ arms
def ort_lm(path: str, threads: int, repeats: int, decode: int, fold: bool) -> dict:
    from hf_tensorcompress.deploy.onnx.runner import empty_cache, load, metadata, step

    session = load(path, threads=threads, fold_constants=fold)
    info = metadata(session)
    prompt = np.random.default_rng(0).integers(0, info["vocab_size"], (1, PROMPT_TOKENS))
    prefill = median_seconds(lambda: step(session, info, prompt, empty_cache(info, 1)), repeats)
    _, cache = step(session, info, prompt, empty_cache(info, 1))

    def decode_steps():
        state = cache
        for token in range(decode):
            _, state = step(session, info, np.asarray([[token + 5]]), state)

    return {"prefill_s": prefill, "decode_token_s": median_seconds(decode_steps, repeats) / decode}


#: the files of the paired decode comparison (``paired_decode``), dense first
PAIRED = ("lm_dense", "lm_tiered4x_ortops", "lm_tiered4x_acc4", "lm_tieredint4_ortops", "lm_tieredint4_acc4")


def paired_decode(paths: dict[str, str], threads: int, rounds: int, decode: int) -> dict:
    """Decode time per token of the files in ``paths`` (name → file, dense first), all loaded in one process and
    timed in turn, ``rounds`` times: each round's ratio to dense is taken within the round, so the machine's drift
    between separate processes (10-30 % here) cancels; the median ratio over rounds and the rounds' ratios."""
    from hf_tensorcompress.deploy.onnx.runner import empty_cache, load, metadata, step

    sessions = {name: load(path, threads=threads) for name, path in paths.items()}
    names, dense = list(sessions), next(iter(sessions))
    info = metadata(sessions[dense])
    prompt = np.random.default_rng(0).integers(0, info["vocab_size"], (1, PROMPT_TOKENS))
    caches = {name: step(session, info, prompt, empty_cache(info, 1))[1] for name, session in sessions.items()}

    def per_token(name: str) -> float:
        state, start = caches[name], time.perf_counter()
        for token in range(decode):
            _, state = step(sessions[name], info, np.asarray([[token + 5]]), state)
        return (time.perf_counter() - start) / decode

    for name in names:  # warm-up
        per_token(name)
    times = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            times[name].append(per_token(name))
    ratios = {name: [t / d for t, d in zip(times[name], times[dense])] for name in names[1:]}
    return {
        "decode_token_s": {name: statistics.median(values) for name, values in times.items()},
        "vs_dense_median": {name: statistics.median(values) for name, values in ratios.items()},
        "vs_dense_rounds": ratios,
    }


def torch_lm(folder: str, threads: int, repeats: int, decode: int) -> dict:
    import torch

    from hf_tensorcompress import load_model

    torch.set_num_threads(threads)
    model = load_model(folder).float().eval()
    prompt = torch.from_numpy(np.random.default_rng(0).integers(0, model.config.vocab_size, (1, PROMPT_TOKENS)))
    with torch.no_grad():
        prefill = median_seconds(lambda: model(prompt, use_cache=True), repeats)
        cache = model(prompt, use_cache=True).past_key_values

        def decode_steps():
            import copy

            state = copy.deepcopy(cache)
            for token in range(decode):
                state = model(torch.tensor([[token + 5]]), past_key_values=state, use_cache=True).past_key_values

        return {"prefill_s": prefill, "decode_token_s": median_seconds(decode_steps, repeats) / decode}


def ort_ts(path: str, threads: int, repeats: int, fold: bool) -> dict:
    from hf_tensorcompress.deploy.onnx.runner import forecast, load

    session = load(path, threads=threads, fold_constants=fold)
    rng = np.random.default_rng(0)
    shape = (PATCHTST["context_length"], PATCHTST["num_input_channels"])
    return {
        f"forecast_b{batch}_s": median_seconds(
            lambda b=batch: forecast(session, rng.standard_normal((b, *shape)).astype(np.float32)), repeats
        )
        for batch in FORECAST_BATCHES
    }


def torch_ts(folder: str, threads: int, repeats: int) -> dict:
    import torch

    from hf_tensorcompress import load_model

    torch.set_num_threads(threads)
    model = load_model(folder).float().eval()
    shape = (PATCHTST["context_length"], PATCHTST["num_input_channels"])
    with torch.no_grad():
        return {
            f"forecast_b{batch}_s": median_seconds(lambda b=batch: model(past_values=torch.randn(b, *shape)), repeats)
            for batch in FORECAST_BATCHES
        }


def arms(files: dict) -> dict[str, tuple]:
    """arm → (function name, path, extra arguments); ``_nofold`` arms load with constant folding off."""
    table = {}
    for family, function in (("lm", "ort_lm"), ("ts", "ort_ts")):
        table[f"{family}_dense_onnx"] = (function, files[f"{family}_dense_onnx"], True)
        for baseline in ("ort_int4", "ort_int4_acc4"):
            table[f"{family}_{baseline}_onnx"] = (function, files[f"{family}_{baseline}_onnx"], True)
        for name in EXPORTS:
            if name.startswith(family) and not name.endswith("dense"):
                table[f"{name}_onnx"] = (function, files[f"{name}_onnx"], True)
                if not name.endswith("acc4"):
                    table[f"{name}_onnx_nofold"] = (function, files[f"{name}_onnx"], False)
    table["lm_tiered_torch"] = ("torch_lm", files["lm_tiered_folder"])
    table["ts_cp_torch"] = ("torch_ts", files["ts_cp_folder"])
    return table


def child(arm: str, files: dict, threads: int, repeats: int, decode: int) -> dict:
    name, path, *extra = arms(files)[arm]
    function = globals()[name]
    arguments = (path, threads, repeats) + ((decode,) if name.endswith("lm") else ()) + tuple(extra)
    return {**function(*arguments), "peak_rss_mb": peak_rss_mb()}


# ------------------------------------------------------------------------------------------------------ checks
def greedy_check(files: dict, new_tokens: int = 32) -> dict:
    """The greedy tokens of every exported compressed LM against its PyTorch checkpoint's."""
    import torch
    from transformers import AutoTokenizer

    from hf_tensorcompress import load_model
    from hf_tensorcompress.deploy.onnx.runner import generate, load

    out = {}
    for name, (folder_key, _, _) in EXPORTS.items():
        if not name.startswith("lm_") or folder_key == "lm_dense":
            continue
        folder = files[f"{folder_key}_folder"]
        prompt = AutoTokenizer.from_pretrained(folder)("The capital of France is", return_tensors="pt").input_ids
        with torch.no_grad():
            expected = (
                load_model(folder)
                .float()
                .eval()
                .generate(prompt, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
            )
        expected = expected[0, prompt.shape[1] :].tolist()
        got = generate(load(files[f"{name}_onnx"], threads=2), prompt[0].tolist(), new_tokens)
        out[name] = {
            "tokens": new_tokens,
            "identical": got == expected,
            "first_difference": _first_difference(got, expected),
        }
    return out


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def sizes(files: dict) -> dict:
    """File bytes, and the target's reference: the checkpoint's compressed bytes plus the rest at fp32."""
    from safetensors import safe_open

    def checkpoint_parts(folder: str) -> tuple[int, int]:
        compressed = rest = 0
        with safe_open(str(Path(folder) / "model.safetensors"), "pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                if tensor.dtype.is_floating_point and tensor.numel() > 1 and "stored" not in key and "tiers" not in key:
                    if "scale" in key or "minimum" in key or "codebook" in key:
                        compressed += tensor.numel() * tensor.element_size()
                    else:
                        rest += tensor.numel() * 4
                else:
                    compressed += tensor.numel() * tensor.element_size()
        return compressed, rest

    out = {}
    for name, (folder_key, _, _) in EXPORTS.items():
        if name.endswith("dense"):
            continue
        compressed, rest = checkpoint_parts(files[f"{folder_key}_folder"])
        family = name.split("_")[0]
        out[name] = {
            "checkpoint_bytes": (Path(files[f"{folder_key}_folder"]) / "model.safetensors").stat().st_size,
            "checkpoint_compressed_plus_fp32_rest": compressed + rest,
            "onnx_bytes": Path(files[f"{name}_onnx"]).stat().st_size,
            "dense_onnx_bytes": Path(files[f"{family}_dense_onnx"]).stat().st_size,
            "ort_int4_onnx_bytes": Path(files[f"{family}_ort_int4_onnx"]).stat().st_size,
        }
        out[name]["target_ratio"] = out[name]["onnx_bytes"] / out[name]["checkpoint_compressed_plus_fp32_rest"]
        if family == "lm":  # the compressed tensors are the embedding's: what they save against its fp32 matrix
            out[name]["embedding_saving_bytes"] = dense_embedding_bytes(files["lm_dense_folder"]) - compressed
            out[name]["smaller_than_dense_onnx_by"] = out[name]["dense_onnx_bytes"] - out[name]["onnx_bytes"]
    return out


def dense_embedding_bytes(folder: str) -> int:
    """fp32 bytes of the dense checkpoint's token embedding (tied with the head, stored once)."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), "pt") as handle:
        (key,) = [key for key in handle.keys() if key.endswith("embed_tokens.weight")]
        rows, width = handle.get_slice(key).get_shape()
        return rows * width * 4


def run_child(arm: str, threads: int, files: dict, options: list[str]) -> dict:
    """This script run again in a fresh process for one arm (or the paired comparison); its JSON line."""
    command = [sys.executable, __file__, "--child", arm, "--threads", str(threads), "--files", json.dumps(files)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    output = subprocess.run(command + options, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "hf_tensorcompress" / "onnx-benchmark"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--arms", nargs="*", help="run only the arms whose names start with one of these")
    parser.add_argument("--thread-counts", nargs="*", type=int, default=list(THREADS))
    parser.add_argument("--paired-rounds", type=int, default=9, help="rounds of the paired decode comparison (0: none)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "paired":
        paths = {name: json.loads(args.files)[f"{name}_onnx"] for name in PAIRED}
        print(json.dumps(paired_decode(paths, args.threads, args.paired_rounds, args.decode_tokens)))
        return
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.files), args.threads, args.repeats, args.decode_tokens)))
        return
    files = build(Path(args.work))
    results: dict = {"sizes": sizes(files), "greedy": greedy_check(files), "arms": {}}
    print(json.dumps(results["sizes"]), json.dumps(results["greedy"]), flush=True)
    for threads in args.thread_counts:
        for arm in arms(files):
            if args.arms and not arm.startswith(tuple(args.arms)):
                continue
            options = ["--repeats", str(args.repeats), "--decode-tokens", str(args.decode_tokens)]
            results["arms"][f"{arm}@{threads}"] = run_child(arm, threads, files, options)
            print(arm, threads, results["arms"][f"{arm}@{threads}"], flush=True)
    results["paired_decode"] = {}
    for threads in args.thread_counts if args.paired_rounds else ():
        options = ["--paired-rounds", str(args.paired_rounds), "--decode-tokens", str(args.decode_tokens)]
        results["paired_decode"][str(threads)] = run_child("paired", threads, files, options)
        print("paired decode", threads, results["paired_decode"][str(threads)]["vs_dense_median"], flush=True)
    ratios, arm = {}, results["arms"]
    for key in arm:
        name, threads = key.split("@")
        dense = arm.get(f"{name.split('_')[0]}_dense_onnx@{threads}")
        if dense is None:  # a run of selected arms without the dense one
            continue
        for measure in ("decode_token_s", *(f"forecast_b{batch}_s" for batch in FORECAST_BATCHES)):
            if measure in arm[key] and not name.endswith("dense_onnx"):
                ratios[f"{name}_{measure.removesuffix('_s')}_vs_dense@{threads}"] = arm[key][measure] / dense[measure]
    results["ratios"] = ratios
    print(json.dumps(results))


if __name__ == "__main__":
    main()
