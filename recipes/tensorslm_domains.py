"""TensorSLM across domains: calibrate on one corpus, score perplexity on the held-out part of every corpus, for TT
token embeddings and the simple baselines at the same parameter count.

    accelerate launch recipes/tensorslm_domains.py --output-dir out/domains [--model DIR] \\
        [--corpus NAME=DIR ...] [--mail-corpus NAME ...] [--ratios 2] [--dtype bfloat16 [--float32-build]]

Every corpus (a folder of JSON documents with a ``text`` field; default: Moby Dick, the State of the Union
addresses and SpamAssassin mails) is split by documents: the last ``--held-out-fraction`` is evaluation text, the
rest calibration text, so calibration and evaluation text never overlap, in or across domains. For each target
compression ratio the TT arm (ranks 1,1, output-aware basis, the most frequent tokens dense, as many as the ratio
allows) sets the budget, and every other arm gets at most its parameters (dense rows, factors, basis and fill
row all counted):

- ``svd``: the whole matrix at rank ``k`` (no calibration);
- ``freq-calib`` / ``freq-id``: frequency-only: the most frequent tokens keep their rows, the rest share their
  mean row; frequency from the calibration text, or the tokenizer's merge order (lowest ids, no calibration);
- ``rows+svd-calib``: the TT arm's dense rows, the remaining rows as a rank-``k`` SVD;
- ``rows+svd-output-calib`` / ``-id`` / ``-mixed``: the same SVD taken in the output-aware metric ``W C^{1/2}``
  (calibration covariance), dense rows by calibration counts, lowest ids or half of each (``tt_exact_prior``);
- ``tt-calib`` / ``tt-id`` / ``tt-mixed``: TT of order 3 (SmolLM2: 8×8×9) at ranks 1,1, output-aware basis, dense rows by
  ``tt_exact_prior`` ``"calibration"``, ``"token_id"`` or ``"mixed"``; ``tt-r33-calib``: the same at ranks 3,3
  with fewer dense rows (calibration counts);
- ``tt-plain`` (at 2× only): TT ranks 5,5, no basis, no dense rows, no calibration.

Bytes (``--byte-arms``, ``all`` for every one): weight-only quantization of the same tied embedding through
maintained libraries (``evaluation.quantized_embedding.QUANT_ARMS``: torchao int8, bitsandbytes int8 / NF4 / FP4,
gguf Q8_0 / Q5_0 / Q4_1 / Q4_0; hand-written round-to-nearest for int3 / int2, which none of them stores) and the
``method="tiered"`` settings of ``TIERED_ARMS`` and the 2× ``tt-calib`` arm with int8 / int4 storage (``TT_BYTE_ARMS``,
``tt_storage_bits``); every arm is sized in bytes (bf16 = 1×; parameter-budget arms count
2 bytes a parameter). ``--ratios`` with no value runs only these.

``--dtype bfloat16`` loads, builds and scores the model in bf16, as most checkpoints ship; a CPU with bf16 units
builds it in bf16, any other in float32 (``--float32-build``: in float32 on either, the comparison).

``--permute-vocabulary SEED`` renumbers the vocabulary by a seeded random permutation (embedding rows, an untied
head and every text's ids together: the same model), to check that a setting does not depend on the numbering.

Arms without calibration are scored once per evaluation corpus. Writes ``results.json``, ``table.md`` (Δ ln PPL,
calibration corpus × evaluation corpus, then per arm the mean in domain and the mean and worst across domains, then
every arm by bytes with the Pareto front), ``domains.png`` (Δ ln PPL against compression ratio per arm, in and across
domains; parameter-budget arms) and ``bytes.png`` (Δ ln PPL across domains against bytes, Pareto front marked) to
``--output-dir``. The default model is SmolLM2-135M-Instruct from its GGUF (block linears Q4_1, tied embedding Q8_0,
dequantised; see ``causal_lm.WEIGHTS_NOTE``).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tensorcompress.core import float32_build
from hf_tensorcompress.data.causal_lm import WEIGHTS_NOTE, smollm2_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.evaluation.perplexity import perplexity
from hf_tensorcompress.methods.tt.calibration import TTCalibration, hidden_covariance
from hf_tensorcompress.methods.tt.head import TTTiedHead

from recipekit.domain_arms import BYTE_ARMS, arms, byte_arms
from recipekit.domain_report import byte_summary, plot, plot_bytes, summary, table
from recipekit.vocabulary import permute_vocabulary


def corpora(args) -> dict[str, tuple]:
    """name → (calibration dataset, held-out dataset)."""
    from hf_tensorcompress import assets

    given = (
        dict(item.split("=", 1) for item in args.corpus)
        if args.corpus
        else {"moby_dick": str(assets.moby_dick_dir()), "sotu": str(assets.sotu_dir()), "mail": str(assets.mail_dir())}
    )
    mail = set(args.mail_corpus if args.corpus else ["mail"])
    unknown = mail - set(given)
    if unknown:
        raise ValueError(f"--mail-corpus {sorted(unknown)} names no --corpus (given: {sorted(given)})")
    return {
        name: split_documents(text_dataset(folder, mail_bodies=name in mail), args.held_out_fraction)
        for name, folder in given.items()
    }


def score(model, ids: torch.Tensor, args) -> float:
    head = model.get_output_embeddings()
    if isinstance(head, TTTiedHead):
        head.mode = "cached"  # evaluation under no_grad: rebuild the tied matrix once, not per window
    return perplexity(model, ids, window=args.window, stride=args.stride)["ln_perplexity"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF folder of a causal LM (default: SmolLM2-135M from GGUF)")
    parser.add_argument(
        "--corpus",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a folder of JSON documents with a 'text' field (repeat; default: moby_dick, sotu, mail)",
    )
    parser.add_argument(
        "--mail-corpus",
        action="append",
        default=[],
        metavar="NAME",
        help="a --corpus whose texts are raw mail messages: keep their bodies",
    )
    parser.add_argument("--output-dir", required=True)
    parser.add_argument(
        "--ratios",
        type=float,
        nargs="*",
        default=[2.0],
        help="target compression ratios of the parameter-budget arms (none: only --byte-arms)",
    )
    parser.add_argument(
        "--byte-arms",
        nargs="*",
        default=[],
        metavar="NAME",
        help="quantization arms and tiered settings, compared in bytes ('all' for every one): " + ", ".join(BYTE_ARMS),
    )
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    parser.add_argument(
        "--calibration-corpora",
        nargs="+",
        default=None,
        metavar="NAME",
        help="calibrate only on these corpora (default: every corpus); all are still evaluated",
    )
    parser.add_argument("--held-out-fraction", type=float, default=0.25)
    parser.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens scored per corpus")
    parser.add_argument(
        "--calibration-tokens",
        type=int,
        default=None,
        help="tokens counted per corpus (default: all of its calibration part)",
    )
    parser.add_argument("--covariance-tokens", type=int, default=4096, help="tokens of the hidden-state covariance")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument(
        "--permute-vocabulary",
        type=int,
        default=None,
        metavar="SEED",
        help="renumber the vocabulary by this seed's random permutation (rows, head and every text's ids together: "
        "the same model) to check that a setting does not depend on the token numbering",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="precision the model is loaded, built and scored in (bfloat16: as most checkpoints ship)",
    )
    parser.add_argument(
        "--float32-build",
        action="store_true",
        help="build a bfloat16 model in float32 even on a CPU with bf16 units (the comparison for building in bf16)",
    )
    args = parser.parse_args(argv)

    started = time.perf_counter()
    accelerator = Accelerator()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or str(smollm2_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dense = accelerator.prepare_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)), evaluation_mode=True
    ).eval()
    vocab, hidden = dense.get_input_embeddings().weight.shape
    renumber = (
        torch.arange(vocab) if args.permute_vocabulary is None else permute_vocabulary(dense, args.permute_vocabulary)
    )

    texts = corpora(args)
    unknown = set(args.calibration_corpora or []) - set(texts)
    if unknown:
        raise ValueError(f"--calibration-corpora {sorted(unknown)} names no corpus (corpora: {sorted(texts)})")
    known = {name for ratio in args.ratios for name, *_ in arms(vocab, hidden, ratio)}
    if set(args.arms or []) - known:
        raise ValueError(f"--arms {sorted(set(args.arms) - known)}: no such arm; choose from {sorted(known)}")
    byte_names = BYTE_ARMS if args.byte_arms == ["all"] else args.byte_arms
    if set(byte_names) - set(BYTE_ARMS):
        raise ValueError(
            f"--byte-arms {sorted(set(byte_names) - set(BYTE_ARMS))}: no such arm; choose from {BYTE_ARMS} or 'all'"
        )
    held_out = {name: renumber[token_ids(tokenizer, split[1], args.eval_tokens)] for name, split in texts.items()}
    calibrations = {}
    for name, (build, _) in texts.items():
        if args.calibration_corpora and name not in args.calibration_corpora:
            continue
        ids = renumber[token_ids(tokenizer, build, args.calibration_tokens)]
        counts = torch.bincount(ids, minlength=vocab)[:vocab]
        calibrations[name] = TTCalibration(counts, hidden_covariance(dense, ids[: args.covariance_tokens]))
    base = {name: score(dense, ids, args) for name, ids in held_out.items()}
    accelerator.print("dense ln PPL: " + ", ".join(f"{name} {value:.3f}" for name, value in base.items()))

    dense_bytes = vocab * hidden * 2  # bf16
    jobs = [
        (ratio, name, calibrated, build, "params")
        for ratio in args.ratios
        for name, calibrated, build in arms(vocab, hidden, ratio)
        if not args.arms or name in args.arms
    ]
    jobs += [
        (None, name, calibrated, build, "bytes") for name, calibrated, build in byte_arms(byte_names, vocab, hidden)
    ]
    runs = []
    for ratio, name, calibrated, build, unit in tqdm(jobs, desc="arms", disable=not accelerator.is_main_process):
        for source in calibrations if calibrated else [None]:
            model = copy.deepcopy(dense)
            start = time.perf_counter()
            with float32_build.forced_float32(args.float32_build):
                size = build(model, calibrations[source] if source else None)
            seconds = time.perf_counter() - start
            stored = size * 2 if unit == "params" else size  # parameter arms store bf16 values
            for target, ids in held_out.items():
                delta = score(model, ids, args) - base[target]
                runs.append(
                    {
                        "arm": name,
                        "target_ratio": ratio,
                        "calibration": source,
                        "evaluation": target,
                        "embedding_params": size if unit == "params" else None,
                        "compression_ratio": vocab * hidden / size if unit == "params" else None,
                        "embedding_bytes": stored,
                        "smaller_than_bf16": dense_bytes / stored,
                        "delta_ln_ppl": delta,
                        "compress_seconds": seconds,
                    }
                )
                accelerator.print(
                    f"{name:<24} calib {source or '-':<10} eval {target:<10} "
                    f"{dense_bytes / stored:5.2f}x smaller than bf16  Δ ln PPL {delta:7.3f}"
                )
            del model

    results = {
        "model": model_dir,
        "weights": WEIGHTS_NOTE if args.model is None else model_dir,
        "corpora": {
            name: {
                "calibration_documents": len(split[0]),
                "held_out_documents": len(split[1]),
                "held_out_tokens": len(held_out[name]),
                "dense_ln_ppl": base[name],
            }
            for name, split in texts.items()
        },
        "settings": {
            key: getattr(args, key)
            for key in (
                "held_out_fraction",
                "eval_tokens",
                "calibration_tokens",
                "covariance_tokens",
                "window",
                "stride",
                "dtype",
                "float32_build",
                "ratios",
                "calibration_corpora",
                "arms",
                "byte_arms",
                "permute_vocabulary",
            )
        },
        "runs": runs,
        "wall_seconds": time.perf_counter() - started,
    }
    if accelerator.is_main_process:
        (output / "results.json").write_text(json.dumps(results, indent=2))
        (output / "table.md").write_text(table(results) + "\n" + summary(results) + "\n" + byte_summary(results))
        if args.ratios:
            plot(results, output / "domains.png")
        plot_bytes(results, output / "bytes.png")
        accelerator.print(table(results) + "\n" + summary(results) + "\n" + byte_summary(results))
        accelerator.print(f"wall time {results['wall_seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
