"""The tiered embedding and ONNX Runtime's own int4 weight quantization in one ONNX file: what each saves and costs.

    nice -n 5 python benchmarks/onnx_stacked.py [--work DIR] [--size-ratios 4 6] [--eval-tokens 2048] [--window 256]

ONNX Runtime's ``MatMulNBitsQuantizer`` quantizes every ``MatMul`` whose weight is an initializer; the token
embedding is a ``Gather``, so by default it stays an fp32 table (113 MB of SmolLM2-135M). The tiered embedding
compresses that table, and the quantizer run on its export quantizes the transformer's Linears and leaves the stored
embedding as it is (its products read decoded rows, not an initializer). Files, all SmolLM2-135M-Instruct, ONNX
Runtime's quantizer at 4 bits, block 32, ``accuracy_level=4`` (int8 activations, the fast CPU path):

- ``dense``: ``export_onnx`` of the dense model (fp32);
- ``ort_int4``: the quantizer on ``dense`` (its defaults: MatMuls only; the tied head reads the embedding through a
  ``Transpose``, so it stays fp32 with the table);
- ``ort_int4_all``: the quantizer on ``dense`` after ONNX Runtime's basic optimizations (which give the head its own
  transposed initializer), ``op_types_to_quantize=("MatMul", "Gather")``: every Linear, the head and the embedding
  (``GatherBlockQuantized``) at int4 — ONNX Runtime's own tools at their smallest;
- ``tiered_Nx``: ``export_onnx`` of ``CompressionConfig(method="tiered", size_ratio=N, rounding="output",
  model_text_tokens=0)`` calibrated on the build split (first 75 % of documents) of Moby Dick;
- ``tiered_Nx_ort_int4``: the quantizer on ``tiered_Nx``.

Quality: ln perplexity of each file in ONNX Runtime on the first ``--eval-tokens`` of the held-out split (last 25 %
of documents) of the SOTU and mail corpora, which calibration never saw, in windows of ``--window`` tokens (each
window scored from its second token). Speed: time per decoded token of the int4 files against the dense export,
all loaded in one process and timed in turn (``onnx_runtime.paired_decode``: ``--rounds`` rounds of 8 tokens after
a 128-token prompt, at 1 and 2 threads; the median of the per-round ratios). The last line printed is one JSON object
with all figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_runtime import optimized, paired_decode, quantize_linears  # noqa: E402  (shared benchmark helpers)
from tiered_generate import build_checkpoint  # noqa: E402

CORPORA = ("sotu", "mail")

#: The tiered files weigh rows by the calibration text alone, as in the deployment page's table (the default, 8,192
#: tokens of the model's own text as well, loses less on these corpora in PyTorch: docs/methods/tiered.md).
TIERED_MODEL_TEXT_TOKENS = 0


def build(work: Path, size_ratios: list[float]) -> dict[str, Path]:
    """Every file (made once in ``work``)."""
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.deploy.onnx import export_onnx

    work.mkdir(parents=True, exist_ok=True)
    files = {"dense": work / "dense.onnx", "ort_int4": work / "dense-ort-int4.onnx"}
    if not files["dense"].exists():
        export_onnx(smollm2_dir(), files["dense"])
    if not files["ort_int4"].exists():
        quantize_linears(files["dense"], files["ort_int4"], accuracy_level=4)
    files["ort_int4_all"] = work / "dense-ort-int4-all.onnx"
    if not files["ort_int4_all"].exists():
        optimized(files["dense"], work / "dense-optimized.onnx")
        quantize_linears(work / "dense-optimized.onnx", files["ort_int4_all"], accuracy_level=4, gather=True)
    for ratio in size_ratios:
        name, folder = f"tiered_{ratio:g}x", work / f"smollm2-tiered-{ratio:g}x"
        if not (folder / "config.json").exists():
            options = {"size_ratio": ratio, "rounding": "output", "model_text_tokens": TIERED_MODEL_TEXT_TOKENS}
            print(build_checkpoint(folder, options, smollm2_dir(), False))
        files[name], files[f"{name}_ort_int4"] = (
            work / f"tiered-{ratio:g}x.onnx",
            work / f"tiered-{ratio:g}x-ort-int4.onnx",
        )
        if not files[name].exists():
            export_onnx(folder, files[name])
        if not files[f"{name}_ort_int4"].exists():
            quantize_linears(files[name], files[f"{name}_ort_int4"], accuracy_level=4)
    return files


def held_out_ids(tokens: int) -> dict[str, np.ndarray]:
    from transformers import AutoTokenizer

    from hf_tensorcompress import assets
    from hf_tensorcompress.data.causal_lm import smollm2_dir
    from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    folders = {"sotu": assets.sotu_dir(), "mail": assets.mail_dir()}
    return {
        name: token_ids(
            tokenizer, split_documents(text_dataset(folders[name], mail_bodies=name == "mail"), 0.25)[1], tokens
        ).numpy()  # fmt: skip
        for name in CORPORA
    }


def ln_perplexity(path: Path, ids: np.ndarray, window: int) -> float:
    """Mean negative log-likelihood of ``ids`` under the exported LM, window by window from an empty cache."""
    from hf_tensorcompress.deploy.onnx.runner import empty_cache, load, metadata

    session = load(path, threads=2)
    info = metadata(session)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window][None].astype(np.int64)
        positions = np.arange(chunk.shape[1], dtype=np.int64)[None]
        feeds = {"input_ids": chunk, "position_ids": positions, **empty_cache(info, 1)}
        logits = session.run(None, feeds)[0][0, :-1].astype(np.float64)
        top = logits.max(axis=-1)
        log_normalizer = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
        targets = chunk[0, 1:]
        total += float((log_normalizer - logits[np.arange(len(targets)), targets]).sum())
        count += len(targets)
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "hf_tensorcompress" / "onnx-stacked"))
    parser.add_argument("--size-ratios", type=float, nargs="+", default=[4, 6])
    parser.add_argument("--eval-tokens", type=int, default=2048)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the paired decode timing (0: none)")
    args = parser.parse_args()
    files = build(Path(args.work), args.size_ratios)
    texts = held_out_ids(args.eval_tokens)
    results = {"size_ratios": args.size_ratios, "eval_tokens": args.eval_tokens, "window": args.window, "files": {}}
    for name, path in files.items():
        scores = {corpus: ln_perplexity(path, ids, args.window) for corpus, ids in texts.items()}
        results["files"][name] = {"bytes": path.stat().st_size, "ln_perplexity": scores}
    dense = results["files"]["dense"]["ln_perplexity"]
    for name, record in results["files"].items():
        record["delta"] = {corpus: record["ln_perplexity"][corpus] - dense[corpus] for corpus in CORPORA}
        record["smaller_than_dense"] = results["files"]["dense"]["bytes"] / record["bytes"]
        print(f"{name:16s} {record['bytes']:>12,} bytes  " + "  ".join(
            f"Δ {corpus} {record['delta'][corpus]:.3f}" for corpus in CORPORA), flush=True)  # fmt: skip
    timed = {name: str(path) for name, path in files.items() if name == "dense" or "int4" in name}
    results["paired_decode"] = {}
    for threads in (1, 2) if args.rounds else ():
        results["paired_decode"][threads] = paired_decode(timed, threads, args.rounds, decode=8)
        print(f"decode time / dense, {threads} thread(s):", results["paired_decode"][threads]["vs_dense_median"])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
