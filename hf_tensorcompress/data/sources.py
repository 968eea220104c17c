"""Where forecasting data comes from: the Appliances Energy default, a CSV file, a local folder or a datasets id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pandas as pd

from ..assets import appliances_energy_csv
from .prepare import prepare_forecasting

#: Random-noise columns the Appliances Energy authors added on purpose (to test feature selection).
APPLIANCES_NOISE_COLUMNS = ("rv1", "rv2")
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.xz", ".csv.bz2", ".csv.zip", ".tsv")


def load_appliances_energy(**kwargs: Any) -> datasets.DatasetDict:
    """UCI Appliances Energy (19735 rows, 10-minute): 26 real channels, 7:1:2 chronological split, standardised."""
    kwargs.setdefault("drop_columns", APPLIANCES_NOISE_COLUMNS)
    kwargs.setdefault("timestamp_column", "date")
    return load_forecasting_csv(appliances_energy_csv(), **kwargs)


def load_forecasting_csv(path: str | Path, **kwargs: Any) -> datasets.DatasetDict:
    """A CSV file (compressed ones too) -> ``prepare_forecasting``; keyword arguments go there."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV file at {path}")
    separator = "\t" if path.name.endswith(".tsv") else ","
    try:
        frame = pd.read_csv(path, sep=separator)
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a readable CSV file: {error}") from None
    return prepare_forecasting(frame, **kwargs)


def load_forecasting_dataset(source: Any, **kwargs: Any) -> datasets.DatasetDict:
    """Any forecasting source -> ``prepare_forecasting``.

    ``source``: ``None`` (the Appliances Energy default), a DataFrame / Dataset / DatasetDict, a CSV file, a folder
    written by ``save_to_disk``, any other folder ``datasets.load_dataset`` reads (CSV/Parquet/JSON files), or a
    dataset id (needs the Hub).
    """
    if source is None:
        return load_appliances_energy(**kwargs)
    if isinstance(source, (pd.DataFrame, datasets.Dataset, datasets.DatasetDict)):
        return prepare_forecasting(source, **kwargs)
    path = Path(source)
    if path.is_file():
        if not path.name.lower().endswith(CSV_SUFFIXES):
            raise ValueError(f"{path} is a file but not a CSV ({', '.join(CSV_SUFFIXES)}); pass a CSV file or a folder")
        return load_forecasting_csv(path, **kwargs)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        return prepare_forecasting(datasets.load_from_disk(str(path)), **kwargs)
    return prepare_forecasting(datasets.load_dataset(str(source)), **kwargs)
