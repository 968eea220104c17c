"""SmolLM2-135M, the whole checkpoint: bytes on disk and peak RSS after load against Δ ln PPL on the two corpora the
calibration never saw, for the quantizers a user would pick and this library's tiered embedding stacked with each.

    OMP_NUM_THREADS=2 python benchmarks/whole_model.py --output-dir docs/results/whole_model

Arms (every one saved, then loaded in a fresh process):

- ``bf16``: the source GGUF (Q4_1 block Linears, Q8_0 embedding) dequantized and saved in bf16: the reference (Δ 0);
- ``torchao-int8``: every block Linear int8 weight-only per row (transformers' ``TorchAoConfig`` at load) and the
  tied embedding torchao int8 per row: transformers 5.24 + torchao 0.18 cannot save a tied int8 embedding
  (``include_input_output_embeddings`` leaves it float; ``untie_embedding_weights`` loses the head on reload), so
  its values are torchao's (``quantize_embedding(model, "torchao-int8-row")``) and its bytes are counted as torchao
  stores them (the file's bf16 embedding replaced by torchao's codes and scales; its RSS holds the bf16 matrix);
- ``gguf-q8_0`` / ``gguf-q4_0``: every 2-D tensor of the source requantized by the ``gguf`` package (1-D norms stay
  F32, as llama.cpp's quantizer keeps them), written as a GGUF file and loaded by transformers (which dequantizes it:
  the RSS is bf16's);
- ``bnb-nf4``: every block Linear bitsandbytes NF4 (double-quantized scales; transformers' ``BitsAndBytesConfig`` at
  load), the embedding bf16;
- ``tiered-6x``: the tied embedding ``method="tiered"`` with the README's 6× setting (``tier_tokens=[2000],
  tier_bits=[4, "codebook"], rounding="output"``: ``tiered-int4/codebook-2k`` of ``recipes/tensorslm_domains.py``,
  calibrated on the first 75 % of Moby Dick), the rest bf16 (what ``hf-tensorcompress compress`` writes);
  ``tiered-6x+torchao-int8`` / ``tiered-6x+bnb-nf4``: the same with ``compress --quantize-linears torchao-int8`` /
  ``bnb-nf4`` (``quantize_linears`` on the float weights, then the bf16 cast).

Bytes: every file of the saved folder (a GGUF arm: its .gguf file; ``torchao-int8``: as above). Peak RSS: VmHWM of a
fresh Python that imports torch, transformers and the library and loads the checkpoint (as stored: bf16; GGUF
dequantized to bf16). Δ ln PPL: the recipe's corpora, held-out split, token count and scorer
(``recipes/tensorslm_domains.py``: the last 25 % of the State of the Union addresses and of the mail bodies,
``--eval-tokens`` each, windows of 256), computed in float32 from the stored values (the loaded model cast up;
packed codes stay packed), against ``bf16``. The Pareto front: no other arm is as small or smaller on disk with a
lower mean Δ. Writes ``results.json``, ``table.md`` and ``whole_model.png`` to ``--output-dir``; the last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes"))
from tensorslm_domains import byte_arms, corpora  # noqa: E402  (the recipe's corpora and tiered arm)

from hf_tensorcompress import assets, quantize_linears  # noqa: E402
from hf_tensorcompress.cli import linear_quantization  # noqa: E402  (the CLI's --quantize-linears configs)
from hf_tensorcompress.core.extras import require  # noqa: E402
from hf_tensorcompress.data.text import token_ids  # noqa: E402
from hf_tensorcompress.evaluation.quantized_embedding import quantize_embedding  # noqa: E402
from hf_tensorcompress.loading import load_model  # noqa: E402
from hf_tensorcompress.methods.tt.calibration import TTCalibration, hidden_covariance  # noqa: E402

TIERED_ARM = "tiered-int4/codebook-2k"
CALIBRATION = "moby_dick"
ARMS = [
    "bf16",
    "torchao-int8",
    "gguf-q8_0",
    "gguf-q4_0",
    "bnb-nf4",
    "tiered-6x",
    "tiered-6x+torchao-int8",
    "tiered-6x+bnb-nf4",
]

#: Run in a fresh Python per arm: load as stored, read the peak RSS, cast up to float32, score with the recipe.
CHILD = """
import json, sys, torch
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
import hf_tensorcompress  # noqa: F401  (registers the library's quantizer)
from transformers import AutoModelForCausalLM
path, ids_file, root, window, stride = sys.argv[1:6]
before = status("VmRSS")
if path.endswith(".gguf"):
    from pathlib import Path
    model = AutoModelForCausalLM.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name,
                                                 dtype=torch.bfloat16)
else:
    model = AutoModelForCausalLM.from_pretrained(path)
peak = status("VmHWM")
torch.nn.Module.to(model.eval(), torch.float32)  # exact up-cast of the stored values; packed codes stay packed
sys.path.insert(0, root + "/recipes")
from argparse import Namespace
from tensorslm_domains import score
args = Namespace(window=int(window), stride=int(stride))
scores = {name: score(model, ids, args) for name, ids in torch.load(ids_file).items()}
print(json.dumps({"rss_before_load": before, "peak_rss": peak, "ln_ppl": scores}))
"""


def folder_bytes(path: Path) -> int:
    """Every file of a saved folder, or the one file of a GGUF arm."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def requantized_gguf(source: Path, target: Path, kind: str) -> Path:
    """``source`` with every 2-D tensor dequantized and quantized again as ``kind`` by the gguf package (1-D tensors
    F32), its metadata copied."""
    gguf = require("gguf", "the GGUF arms")
    quant_type = getattr(gguf.GGMLQuantizationType, kind)
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith(
            "GGUF."
        ):
            continue
        kind_of = field.types[0]
        sub_type = field.types[-1] if kind_of == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind_of, sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32")
        if values.ndim == 2:
            writer.add_tensor(tensor.name, gguf.quants.quantize(values, quant_type), raw_dtype=quant_type)
        else:
            writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def measure(path: Path, ids_file: Path, args) -> dict:
    """The fresh-process load and scoring of one saved arm (``CHILD``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(ids_file), str(ROOT), str(args.window),
         str(args.stride)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"loading {path} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def build_arms(names: list[str], work: Path, dense, calibration: TTCalibration) -> dict[str, tuple[Path, int]]:
    """Save every arm of ``names`` under ``work``: ``{arm: (path, bytes)}``."""
    bf16_dir = work / "bf16"
    copy.deepcopy(dense).to(torch.bfloat16).save_pretrained(bf16_dir)
    saved: dict[str, tuple[Path, int]] = {"bf16": (bf16_dir, folder_bytes(bf16_dir))}
    vocab, hidden = dense.get_input_embeddings().weight.shape
    if "torchao-int8" in names:
        model = copy.deepcopy(dense).to(torch.bfloat16)
        embedding_bytes = quantize_embedding(model, "torchao-int8-row")
        model.save_pretrained(work / "torchao-embedding")
        int8 = linear_quantization("torchao-int8")
        quantized = AutoModelForCausalLM.from_pretrained(work / "torchao-embedding", quantization_config=int8)
        quantized.save_pretrained(work / "torchao-int8")
        size = folder_bytes(work / "torchao-int8") - vocab * hidden * 2 + embedding_bytes
        saved["torchao-int8"] = (work / "torchao-int8", size)
    for kind in ("q8_0", "q4_0"):
        if f"gguf-{kind}" in names:
            path = requantized_gguf(assets.smollm2_gguf(), work / f"smollm2-{kind}.gguf", kind.upper())
            saved[f"gguf-{kind}"] = (path, folder_bytes(path))
    if "bnb-nf4" in names:
        model = AutoModelForCausalLM.from_pretrained(bf16_dir, quantization_config=linear_quantization("bnb-nf4"))
        model.save_pretrained(work / "bnb-nf4")
        saved["bnb-nf4"] = (work / "bnb-nf4", folder_bytes(work / "bnb-nf4"))
    tiered = [name for name in names if name.startswith("tiered-6x")]
    if tiered:
        compressed = copy.deepcopy(dense)
        (_, _, build), *_ = byte_arms([TIERED_ARM], vocab, hidden)
        build(compressed, calibration)
        for name in tiered:
            model = copy.deepcopy(compressed)
            stacking = name.partition("+")[2]
            if stacking:
                quantize_linears(model, linear_quantization(stacking))
            model.to(torch.bfloat16).save_pretrained(work / name)
            saved[name] = (work / name, folder_bytes(work / name))
    return saved


def pareto(rows: list[dict], size: str) -> None:
    """Mark ``pareto_<size>`` on each row no other row beats: as small or smaller, with a lower mean Δ."""
    for row in rows:
        row[f"pareto_{size}"] = not any(
            other is not row and other[size] <= row[size] and other["delta_mean"] < row["delta_mean"] for other in rows
        )


def table(rows: list[dict], reference: dict, names: list[str]) -> str:
    lines = [
        "| arm | MB on disk | × smaller than bf16 | peak RSS after load, MB | "
        + " | ".join(f"Δ ln PPL {name}" for name in names)
        + " | Δ mean | Pareto (disk) |",
        "|---|---|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for row in sorted(rows, key=lambda row: row["bytes"]):
        deltas = " | ".join(f"{row['delta'][name]:+.3f}" for name in names)
        lines.append(
            f"| {row['arm']} | {row['bytes'] / 1e6:.1f} | {reference['bytes'] / row['bytes']:.2f}× | "
            f"{row['peak_rss'] / 1e6:.0f} | {deltas} | {row['delta_mean']:+.3f} | {'★' if row['pareto_bytes'] else ''} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    matplotlib = require("matplotlib", "the whole-model figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, size, label in ((axes[0], "bytes", "MB on disk"), (axes[1], "peak_rss", "peak RSS after load, MB")):
        for row in rows:
            ours = row["arm"].startswith("tiered")
            ax.plot(
                row[size] / 1e6,
                row["delta_mean"],
                "o" if ours else "s",
                color="tab:blue" if ours else "tab:orange",
                markersize=8 if row[f"pareto_{size}"] else 5,
                markeredgecolor="black" if row[f"pareto_{size}"] else "none",
            )
            ax.annotate(row["arm"], (row[size] / 1e6, row["delta_mean"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
        front = sorted((row for row in rows if row[f"pareto_{size}"]), key=lambda row: row[size])
        ax.plot([r[size] / 1e6 for r in front], [r["delta_mean"] for r in front], "k--", lw=0.8)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("Δ ln PPL vs bf16, mean of the two held-out domains")
    axes[0].plot([], [], "s", color="tab:orange", label="quantizers (torchao, gguf, bitsandbytes)")
    axes[0].plot([], [], "o", color="tab:blue", label="tiered 6× embedding (this library) + Linears")
    axes[0].plot([], [], "k--", lw=0.8, label="Pareto front")
    axes[0].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M, the whole checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS)
    parser.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens scored per corpus")
    parser.add_argument("--held-out-fraction", type=float, default=0.25)
    parser.add_argument("--covariance-tokens", type=int, default=4096, help="tokens of the hidden-state covariance")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--stride", type=int, default=256)
    args = parser.parse_args(argv)
    args.corpus, args.mail_corpus = [], []  # the recipe's default corpora

    started = time.perf_counter()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    source = assets.smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    dense = load_model(source).eval()
    vocab = dense.get_input_embeddings().weight.shape[0]
    texts = corpora(args)
    held_out = {name: token_ids(tokenizer, split[1], args.eval_tokens) for name, split in texts.items()}
    held_out = {name: ids for name, ids in held_out.items() if name != CALIBRATION}
    ids = token_ids(tokenizer, texts[CALIBRATION][0])
    counts = torch.bincount(ids, minlength=vocab)[:vocab]
    calibration = TTCalibration(counts, hidden_covariance(dense, ids[: args.covariance_tokens]))

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        ids_file = work / "held_out.pt"
        torch.save(held_out, ids_file)
        names = list(dict.fromkeys(["bf16", *args.arms]))
        saved = build_arms(names, work, dense, calibration)
        del dense
        measured = {}
        for name in names:
            measured[name] = {"bytes": saved[name][1], **measure(saved[name][0], ids_file, args)}
            print(f"{name:<24} {saved[name][1] / 1e6:7.1f} MB  peak RSS {measured[name]['peak_rss'] / 1e6:6.0f} MB  "
                  f"ln PPL {measured[name]['ln_ppl']}", flush=True)  # fmt: skip
    reference = measured["bf16"]
    rows = []
    for name, values in measured.items():
        delta = {corpus: values["ln_ppl"][corpus] - reference["ln_ppl"][corpus] for corpus in held_out}
        rows.append({"arm": name, **values, "delta": delta, "delta_mean": sum(delta.values()) / len(delta)})
    pareto(rows, "bytes")
    pareto(rows, "peak_rss")
    results = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        "source_gguf_bytes": source.stat().st_size,
        "calibration": CALIBRATION,
        "evaluation": {name: len(ids) for name, ids in held_out.items()},
        "settings": {key: getattr(args, key) for key in ("eval_tokens", "held_out_fraction", "window", "stride")},
        "rows": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    (output / "results.json").write_text(json.dumps(results, indent=2))
    (output / "table.md").write_text(table(rows, reference, list(held_out)))
    plot(rows, output / "whole_model.png")
    print(table(rows, reference, list(held_out)))
    print(json.dumps({row["arm"]: {"mb": row["bytes"] / 1e6, "delta_mean": row["delta_mean"]} for row in rows}))
    return results


if __name__ == "__main__":
    main()
