"""The whole SmolLM2-135M compressed or quantized: the tied embedding ``method="tiered"`` (``tiered-int4/int3-20k``
of ``recipes/tensorslm_domains.py``: the 20,000 lowest token ids at int4, the rest at int3, groups of 64,
output-aware rounding calibrated on the first 75 % of Moby Dick) and every block ``nn.Linear`` torchao int8
weight-only per row (``quantize_linears``), saved as one checkpoint and loaded back.

    OMP_NUM_THREADS=1 python benchmarks/stacked_torchao.py [--eval-tokens 2048] [--new-tokens 16]

Arms, each scored on the held-out last 25 % of each corpus (Δ ln PPL against the dense float32 model, windows of
256; the same split as ``recipes/tensorslm_domains.py``): Moby Dick, the calibration domain, and the State of the
Union addresses and the mail bodies, which the calibration never saw: torchao int8 Linears (transformers' ``TorchAoConfig`` at load); the same plus the recipe's torchao int8-per-row
embedding arm (``quantize_embedding(model, "torchao-int8-row")``: the values and bytes torchao stores; transformers'
``include_input_output_embeddings`` leaves a tied ``nn.Embedding`` float with this config); the tiered embedding
alone; the tiered embedding with torchao int8 Linears (stacked). Bytes, against the bf16 whole model (2 bytes a
parameter, the tied matrix once): the int8-Linears ``model.safetensors`` saved from a bf16 load (what a user stores;
scored from a float32 load), the two embedding-only swaps computed from it or from bf16 (the embedding's bf16 bytes
replaced by the arm's), the stacked arm its own saved checkpoint on disk and, loaded back, the bytes its tensors hold in memory (``ram_bytes``). The stacked checkpoint is loaded back with the library (``from_pretrained``): its logits must equal
the saved model's and greedy ``generate()`` must give the same tokens. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchao.quantization import IntxWeightOnlyConfig
from torchao.quantization.granularity import PerAxis
from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

from hf_tensorcompress import CompressionConfig, apply_tiered, assets, quantize_linears
from hf_tensorcompress.data.causal_lm import smollm2_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.evaluation.perplexity import perplexity
from hf_tensorcompress.evaluation.quantized_embedding import quantize_embedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tt_generate import held_bytes  # noqa: E402  (shared benchmark helpers)

TIERED = dict(tier_tokens=[20000], tier_bits=[4, 3], tier_group_size=64, rounding="output")


def int8_linears() -> TorchAoConfig:
    return TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))


def saved_bytes(model, folder: Path) -> int:
    model.save_pretrained(folder)
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens scored")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens generated after the round trip")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    dense_dir = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    corpora = {
        "moby_dick": text_dataset(assets.moby_dick_dir()),
        "sotu": text_dataset(assets.sotu_dir()),
        "mail": text_dataset(assets.mail_dir(), mail_bodies=True),
    }
    splits = {name: split_documents(dataset, 0.25) for name, dataset in corpora.items()}
    calibration = token_ids(tokenizer, splits["moby_dick"][0])
    held_out = {name: token_ids(tokenizer, split[1], args.eval_tokens) for name, split in splits.items()}
    ids = held_out["moby_dick"]

    def score(model) -> dict[str, float]:
        return {
            name: perplexity(model, tokens, window=args.window, stride=args.window)["ln_perplexity"]
            for name, tokens in held_out.items()
        }

    dense = AutoModelForCausalLM.from_pretrained(dense_dir).eval()
    bf16_bytes = 2 * sum(parameter.numel() for parameter in dense.parameters())
    base = score(dense)
    del dense
    arms, work = {}, Path(tempfile.mkdtemp(prefix="stacked_torchao_"))

    def record(name: str, model, stored: int) -> None:
        delta = {corpus: value - base[corpus] for corpus, value in score(model).items()}
        other = (delta["sotu"] + delta["mail"]) / 2  # the domains the calibration never saw
        arms[name] = {"bytes": stored, "smaller_than_bf16": bf16_bytes / stored, "delta_ln_ppl": delta}
        arms[name]["delta_other_domains_mean"] = other
        print(
            f"{name:<30} {stored / 2**20:7.1f} MiB  {bf16_bytes / stored:5.2f}x smaller than bf16  Δ ln PPL "
            + "  ".join(f"{corpus} {value:.4f}" for corpus, value in delta.items())
            + f"  other domains {other:.4f}",
            flush=True,
        )

    in_bf16 = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.bfloat16, quantization_config=int8_linears())
    int8_bytes = saved_bytes(in_bf16, work / "torchao-int8-linears")  # as a user stores it: float tensors in bf16
    del in_bf16
    model = AutoModelForCausalLM.from_pretrained(dense_dir, quantization_config=int8_linears()).eval()
    record("torchao-int8-linears", model, int8_bytes)
    vocab, hidden = model.get_input_embeddings().weight.shape
    with torch.no_grad():  # the recipe's torchao int8-per-row embedding arm (values and bytes) on top
        embedding_int8_bytes = quantize_embedding(model, "torchao-int8-row")
    record("torchao-int8-linears+embedding", model, int8_bytes - 2 * vocab * hidden + embedding_int8_bytes)
    del model
    model = AutoModelForCausalLM.from_pretrained(dense_dir).eval()
    start = time.perf_counter()
    apply_tiered(model, CompressionConfig(method="tiered", **TIERED), calibration)
    compress_seconds = time.perf_counter() - start
    embedding_bytes = model.get_input_embeddings().storage_bits() // 8
    record("tiered-embedding", model, bf16_bytes - 2 * vocab * hidden + embedding_bytes)
    quantize_linears(model, int8_linears())
    record("stacked", model, saved_bytes(model, work / "stacked"))

    prompt = tokenizer("Call me Ishmael. Some years ago", return_tensors="pt").input_ids
    greedy = dict(max_new_tokens=args.new_tokens, do_sample=False)
    with torch.no_grad():
        logits, generated = model(ids[None, : args.window]).logits, model.generate(prompt, **greedy)
        loaded = AutoModelForCausalLM.from_pretrained(work / "stacked").eval()
        arms["stacked"]["ram_bytes"] = held_bytes(loaded)  # loaded back: what it holds in memory
        same_logits = torch.equal(loaded(ids[None, : args.window]).logits, logits)
        again = loaded.generate(prompt, **greedy)
    result = {
        "model": str(dense_dir),
        "held_out_tokens": {name: len(tokens) for name, tokens in held_out.items()},
        "dense_ln_ppl": base,
        "bf16_whole_model_bytes": bf16_bytes,
        "arms": arms,
        "tiered_options": TIERED,
        "tiered_compress_seconds": compress_seconds,
        "tiered_embedding_bytes": embedding_bytes,
        "round_trip_equal_logits": same_logits,
        "round_trip_same_generate": torch.equal(again, generated),
        "generated": tokenizer.decode(again[0]),
        "wall_seconds": time.perf_counter() - started,
    }
    shutil.rmtree(work)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
