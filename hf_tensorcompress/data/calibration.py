"""Calibration text from a user's files, for the methods that fit a compression to the text a model serves
(``tiered``'s output-aware rounding and frequency tiers, ``tt``'s output-aware basis and exact tokens).

Accepted: a text file (``.txt``, ``.md``, any other suffix read as UTF-8 text), a folder of ``.txt`` files (in
natural order: ``chapter_2`` before ``chapter_10``) or of JSON documents with a ``"text"`` field, a ``datasets`` dataset saved with ``save_to_disk``, or a JSON / JSON Lines /
CSV / Parquet file; datasets and tables are read from a text column (``text`` unless named). What was read is
described in one line for the user; anything unreadable is an error naming what would be right.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import torch

from .text import natural_key, text_dataset, token_ids

#: Table formats ``datasets.load_dataset`` reads from a local file, by suffix.
TABLE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def _column(table: datasets.Dataset, column: str, source: Path) -> list[str]:
    if column not in table.column_names:
        raise ValueError(
            f"calibration data {source} has no column {column!r} (its columns: {table.column_names}); name the text "
            "column with --calibration-column"
        )
    texts = table[column]
    if not all(isinstance(text, str) for text in texts):
        raise ValueError(f"calibration data {source}: column {column!r} holds non-text values; name a text column")
    return texts


def read_calibration_text(path: str | Path, column: str = "text") -> tuple[list[str], str]:
    """``(texts, description)`` of the calibration data at ``path`` (module docstring: what is accepted)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"calibration data {path} does not exist; pass a text file, a folder or a data set")
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
            table = datasets.load_from_disk(str(path))
            if isinstance(table, datasets.DatasetDict):
                table = table["train"] if "train" in table else next(iter(table.values()))
            texts, kind = _column(table, column, path), f"a saved data set, column {column!r}"
        elif any(path.glob("*.txt")):
            files = sorted(path.glob("*.txt"), key=natural_key)
            texts, kind = [file.read_text(encoding="utf-8") for file in files], f"{len(files)} .txt files"
        else:
            texts, kind = list(text_dataset(path)["text"]), "JSON documents with a 'text' field"
    elif path.suffix.lower() in TABLE_FORMATS:
        table = datasets.load_dataset(TABLE_FORMATS[path.suffix.lower()], data_files=str(path), split="train")
        texts, kind = _column(table, column, path), f"a {path.suffix.lower()[1:]} table, column {column!r}"
    else:
        texts, kind = [path.read_text(encoding="utf-8")], "a text file"
    texts = [text for text in texts if text.strip()]
    if not texts:
        raise ValueError(f"calibration data {path} holds no text")
    return texts, f"{path}: {kind}, {len(texts)} document(s), {sum(map(len, texts)):,} characters"


def calibration_ids(tokenizer, texts: list[str], max_tokens: int) -> torch.Tensor:
    """The texts as one token stream (``token_ids``), at most ``max_tokens`` long."""
    if max_tokens < 1:
        raise ValueError(f"--calibration-tokens {max_tokens}: must be a positive number of tokens")
    return token_ids(tokenizer, datasets.Dataset.from_dict({"text": texts}), max_tokens)
