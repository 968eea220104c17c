"""Text corpora as ``datasets.Dataset``: folders of JSON documents, document-level splits, token streams."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import torch

from ..core.progress import progress


def natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def mail_body(message: str) -> str:
    """The body of a raw mail message: everything after the first blank line (RFC 5322 ends the headers there);
    the whole text if it has no blank line."""
    head, blank, body = message.replace("\r\n", "\n").partition("\n\n")
    return body if blank else head


def text_dataset(folder: str | Path, mail_bodies: bool = False) -> datasets.Dataset:
    """Every ``*.json`` file of ``folder`` holding an object with a ``"text"`` field, in natural file order
    (Moby Dick: chapter_1 … chapter_135; State of the Union: by year; mails: by number), as columns ``source`` and
    ``text``. ``mail_bodies=True`` keeps only each text's body (``mail_body``: the SpamAssassin mails are raw
    messages whose routing headers are not prose); documents left empty are dropped."""
    rows = []
    for path in sorted(Path(folder).glob("*.json"), key=natural_key):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            text = mail_body(record["text"]) if mail_bodies else record["text"]
            if text.strip():
                rows.append({"source": path.stem, "text": text})
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
    with progress(desc="tokenize", total=max_tokens, unit="token") as bar:
        for text in dataset["text"]:
            ids.extend(tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"])
            bar.update(min(len(ids), max_tokens or len(ids)) - bar.n)
            if max_tokens is not None and len(ids) >= max_tokens:
                break
    return torch.tensor(ids[:max_tokens], dtype=torch.long)
