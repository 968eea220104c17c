"""TT token embeddings on a second real model: all-MiniLM-L6-v2 (BERT, 30522 × 384 embedding = 52 % of its
22.7M parameters), against matrix SVD and frequency-only at the same embedding size.

The model is a sentence encoder (mean-pooled, L2-normalised), so quality is how well the compressed model keeps
the dense model's sentence embeddings on text it was not calibrated on: the mean cosine between the dense and the
compressed embedding of each sentence, and how often each sentence's nearest neighbour (among the others) stays
the same. Calibration (token counts for ``tt_exact_tokens`` and frequency-only) uses the first 75 % of the State
of the Union addresses; evaluation uses sentences of the last 25 % (same domain) and of Moby Dick (another
domain). Every compressed model is saved and loaded back before it is scored. The last line is one JSON object.

    python benchmarks/tt_minilm.py [--sentences 256]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import tempfile

import torch
from transformers import AutoModel, AutoTokenizer

from hf_tensorcompress import CompressionConfig, apply_tt
from hf_tensorcompress.assets import minilm_dir, moby_dick_dir, sotu_dir
from hf_tensorcompress.data.text import split_documents, text_dataset, token_ids
from hf_tensorcompress.loading import load_model
from hf_tensorcompress.methods.tt.energy import apply_svd_embedding, svd_rank_for

SHAPE = [8, 6, 8]


def sentences(dataset, count: int) -> list[str]:
    """The first ``count`` sentences of 8-60 words, in document order."""
    found = []
    for text in dataset["text"]:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if 8 <= len(sentence.split()) <= 60:
                found.append(sentence)
                if len(found) == count:
                    return found
    return found


@torch.no_grad()
def embed(model, tokenizer, texts: list[str], batch: int = 32) -> torch.Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (all-MiniLM-L6-v2's pooling)."""
    rows = []
    for start in range(0, len(texts), batch):
        encoded = tokenizer(
            texts[start : start + batch], padding=True, truncation=True, max_length=128, return_tensors="pt"
        )
        hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"][..., None].to(hidden.dtype)
        rows.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(rows)


def fidelity(reference: torch.Tensor, embeddings: torch.Tensor) -> dict:
    """Mean cosine to the dense embeddings, and nearest-neighbour agreement with the dense model."""

    def neighbours(x: torch.Tensor) -> torch.Tensor:
        similarity = x @ x.T
        similarity.fill_diagonal_(-2.0)
        return similarity.argmax(dim=1)

    return {
        "cosine": float((reference * embeddings).sum(-1).mean()),
        "neighbour_agreement": float((neighbours(reference) == neighbours(embeddings)).float().mean()),
    }


def frequency_only(model, counts: torch.Tensor, keep: int) -> None:
    """Baseline: the ``keep`` most frequent calibration tokens keep their rows, every other row becomes the mean
    row (stored once): ``keep·d + d`` parameters."""
    weight = model.get_input_embeddings().weight
    kept = counts.argsort(descending=True, stable=True)[:keep]
    mean = weight.mean(dim=0)
    dropped = torch.ones(weight.shape[0], dtype=torch.bool)
    dropped[kept] = False
    with torch.no_grad():
        weight[dropped] = mean


def reloaded(model):
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return load_model(folder).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=256, help="evaluation sentences per corpus")
    args = parser.parse_args()
    folder = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dense = AutoModel.from_pretrained(folder).eval()
    vocab, hidden = dense.get_input_embeddings().weight.shape
    dense_params = vocab * hidden
    calibration, held_out = split_documents(text_dataset(sotu_dir()), 0.25)
    calibration_ids = token_ids(tokenizer, calibration)
    counts = torch.bincount(calibration_ids, minlength=vocab)[:vocab]
    corpora = {
        "sotu (held out)": sentences(held_out, args.sentences),
        "moby dick": sentences(text_dataset(moby_dick_dir()), args.sentences),
    }
    print(
        f"all-MiniLM-L6-v2: embedding {vocab}×{hidden} = {dense_params:,} of "
        f"{sum(p.numel() for p in dense.parameters()):,} parameters; calibration {len(calibration_ids):,} tokens "
        f"({int((counts > 0).sum()):,} distinct); {[len(v) for v in corpora.values()]} evaluation sentences"
    )
    references = {name: embed(dense, tokenizer, texts) for name, texts in corpora.items()}

    def score(name: str, model, params: int) -> dict:
        row = {"run": name, "params": params, "ratio": dense_params / params}
        for corpus, texts in corpora.items():
            row[corpus] = fidelity(references[corpus], embed(model, tokenizer, texts))
        print(
            f"{name:<52} {row['ratio']:5.2f}×  "
            + "  ".join(
                f"{corpus}: cos {row[corpus]['cosine']:.4f} nn {row[corpus]['neighbour_agreement']:.3f}"
                for corpus in corpora
            ),
            flush=True,
        )
        return row

    rows = []
    for ranks, exact, basis in (
        [[6, 6], 0, "identity"],
        [[6, 6], 0, "pca"],
        [[4, 4], 0, "pca"],
        [[3, 3], 4000, "pca"],
        [[2, 2], 6000, "pca"],
    ):
        model = copy.deepcopy(dense)
        config = CompressionConfig(method="tt", tt_shape=SHAPE, tt_ranks=ranks, tt_basis=basis, tt_exact_tokens=exact)
        apply_tt(model, config, calibration_ids if exact else None)
        layer = model.get_input_embeddings()
        params = layer.stored_parameters()
        tt_row = score(
            f"TT {'×'.join(map(str, SHAPE))} r{tuple(ranks)} {basis} + {exact} exact", reloaded(model), params
        )
        rows.append(tt_row)
        svd = copy.deepcopy(dense)
        rank = svd_rank_for(vocab, hidden, params)
        rows.append(
            score(
                f"  matrix SVD k={rank} (same size)",
                svd if apply_svd_embedding(svd, rank) else svd,
                rank * (vocab + hidden),
            )
        )
        keep = max(1, params // hidden - 1)
        if keep < vocab:
            frequent = copy.deepcopy(dense)
            frequency_only(frequent, counts, keep)
            rows.append(score(f"  frequency-only, {keep} rows kept (same size)", frequent, (keep + 1) * hidden))
    print(json.dumps({"model": "all-MiniLM-L6-v2", "embedding_params": dense_params, "rows": rows}))


if __name__ == "__main__":
    main()
