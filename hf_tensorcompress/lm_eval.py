"""Causal-LM perplexity on real text: folders of JSON documents as ``datasets.Dataset``, sliding windows + stride.

The per-window NLL sums go through the project's ``evaluate`` module (``evaluate_metrics/perplexity``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .evaluation import load_metric, metric_path

PERPLEXITY_METRIC = metric_path("perplexity")


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def text_dataset(folder: str | Path) -> datasets.Dataset:
    """Every ``*.json`` file of ``folder`` holding an object with a ``"text"`` field, in natural file order
    (Moby Dick: chapter_1 … chapter_135; State of the Union: by year), as columns ``source`` and ``text``."""
    rows = []
    for path in sorted(Path(folder).glob("*.json"), key=_natural_key):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("text"), str) and record["text"].strip():
            rows.append({"source": path.stem, "text": record["text"]})
    if not rows:
        raise ValueError(f"{folder} holds no JSON file with a 'text' field")
    return datasets.Dataset.from_list(rows)


def split_documents(dataset: datasets.Dataset, held_out_fraction: float) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(build, held-out): the last ``held_out_fraction`` of the documents are held out (never used to build or
    calibrate a compression), keeping the order, so held-out text is later text."""
    cut = int(round(len(dataset) * (1.0 - held_out_fraction)))
    if not 0 < cut < len(dataset):
        raise ValueError(f"held_out_fraction={held_out_fraction} leaves an empty split of {len(dataset)} documents")
    return dataset.select(range(cut)), dataset.select(range(cut, len(dataset)))


def token_ids(tokenizer, dataset: datasets.Dataset, max_tokens: int | None = None) -> torch.Tensor:
    """The documents joined by blank lines and tokenized as one stream, cut at ``max_tokens``."""
    ids: list[int] = []
    for text in dataset["text"]:
        ids.extend(tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"])
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    return torch.tensor(ids[:max_tokens], dtype=torch.long)


@torch.no_grad()
def window_nll(model: nn.Module, ids: torch.Tensor, window: int, stride: int, progress: bool = False):
    """Yield ``(nll_sum, predicted_tokens)`` per sliding window: each window scores only the tokens not scored
    by the previous one, with up to ``window - stride`` tokens of context before them."""
    if not 0 < stride <= window:
        raise ValueError(f"need 0 < stride <= window, got stride={stride}, window={window}")
    device = next(model.parameters()).device
    scored_until = 1  # the first token has no prediction
    starts = range(0, max(len(ids) - 1, 1), stride)
    for begin in tqdm(starts, desc="perplexity", disable=not progress):
        end = min(begin + window, len(ids))
        if end <= scored_until:
            break
        chunk = ids[begin:end].to(device)[None]
        logits = model(input_ids=chunk).logits[0, :-1].float()
        targets = chunk[0, 1:].clone()
        first_new = scored_until - begin - 1  # index (in targets) of the first token not scored yet
        targets[: max(first_new, 0)] = -100
        yield F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum").item(), int((targets >= 0).sum())
        scored_until = end


def perplexity(model: nn.Module, ids: torch.Tensor, window: int = 512, stride: int = 256, progress: bool = False) -> dict:
    """``{"perplexity", "ln_perplexity", "tokens"}`` of ``model`` on the token stream ``ids``."""
    metric = load_metric("perplexity")
    was_training = model.training
    model.eval()
    for nll, count in window_nll(model, ids, window, stride, progress):
        metric.add(nll_sum=nll, token_count=count)
    model.train(was_training)
    return metric.compute()
