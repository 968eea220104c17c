"""One place that turns a user's ``--dataset`` value into a table: a file, a folder, or a ``datasets`` id.

A path that does not exist is reported as a missing file, not handed to ``datasets.load_dataset`` (whose error
would say it could not reach the Hub).
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pandas as pd

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.xz", ".csv.bz2", ".csv.zip", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")
#: Endings that mark a value as a file name (so a missing one is a missing file, never a Hub id).
FILE_SUFFIXES = (*CSV_SUFFIXES, *PARQUET_SUFFIXES, ".json", ".jsonl", ".ts", ".arff", ".txt", ".xlsx")

Table = pd.DataFrame | datasets.Dataset | datasets.DatasetDict


def looks_like_path(source: str) -> bool:
    """True for values a user means as a local path: a known file ending, a separator, or ``.``/``~`` at the start."""
    return (
        source.lower().endswith(FILE_SUFFIXES)
        or "\\" in source
        or source.startswith((".", "~", "/"))
        or (source.count("/") > 1)
    )


def read_table(source: str | Path | Table) -> Table:
    """A DataFrame (CSV/TSV/Parquet file), a Dataset/DatasetDict (``save_to_disk`` folder, folder of data files,
    or a ``datasets`` id), or ``source`` itself when it already is a table."""
    if isinstance(source, (pd.DataFrame, datasets.Dataset, datasets.DatasetDict)):
        return source
    path = Path(source).expanduser()
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return datasets.load_from_disk(str(path))
        try:
            return datasets.load_dataset(str(path))
        except (ValueError, FileNotFoundError) as error:
            raise ValueError(f"the folder {path} holds no table datasets can read ({error})") from None
    if looks_like_path(str(source)):
        raise FileNotFoundError(f"{source} does not exist (no such file or folder)")
    try:
        return datasets.load_dataset(str(source))
    except Exception as error:  # noqa: BLE001  (datasets raises many types; each means "cannot read this id")
        raise ValueError(
            f"{source!r} is not a local file or folder, and loading it as a datasets id failed: "
            f"{' '.join(str(error).split())[:300]}"
        ) from None


def _read_file(path: Path) -> pd.DataFrame:
    name = path.name.lower()
    try:
        if name.endswith(CSV_SUFFIXES):
            return pd.read_csv(path, sep="\t" if name.endswith(".tsv") else ",")
        if name.endswith(PARQUET_SUFFIXES):
            return pd.read_parquet(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable table: {' '.join(str(error).split())}") from None
    raise ValueError(f"{path} is not a CSV ({', '.join(CSV_SUFFIXES)}) or Parquet file; pass one of those, or a folder")
