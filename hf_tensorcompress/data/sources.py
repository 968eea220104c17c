"""Where forecasting data comes from: a built-in data set (Appliances Energy, the default; hourly electricity; hourly
bike rentals), a
file, a local folder or a datasets id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pandas as pd

from ..assets import appliances_energy_csv, bikesharing_csv, electricity_csv
from .prepare import prepare_forecasting
from .tables import CSV_SUFFIXES, read_table

#: Random-noise columns the Appliances Energy authors added on purpose (to test feature selection).
APPLIANCES_NOISE_COLUMNS = ("rv1", "rv2")


def load_appliances_energy(**kwargs: Any) -> datasets.DatasetDict:
    """UCI Appliances Energy (19735 rows, 10-minute): 26 real channels, 7:1:2 chronological split, standardised."""
    kwargs.setdefault("drop_columns", APPLIANCES_NOISE_COLUMNS)
    kwargs.setdefault("timestamp_column", "date")
    return load_forecasting_csv(appliances_energy_csv(), **kwargs)


def load_electricity(**kwargs: Any) -> datasets.DatasetDict:
    """Hourly electricity load 2012–2014 (26,304 rows, one channel ``y``: the mean of the 321 ECL clients), 7:1:2
    chronological split, standardised. Daily and weekly cycles a model must read from a long context."""
    kwargs.setdefault("timestamp_column", "ts")
    return load_forecasting_csv(electricity_csv(), **kwargs)


def load_bikesharing(**kwargs: Any) -> datasets.DatasetDict:
    """Hourly bike rentals 2010–2019 (78,421 rows): the target ``count``; the day's weather (``tmin``, ``tmax``,
    ``pn``) as covariates, for the models that read them; 7:1:2 chronological split, standardised. Daily and weekly
    cycles on a level that grows over the years (the test years rent more than any training year)."""
    kwargs.setdefault("timestamp_column", "ts")
    kwargs.setdefault("drop_columns", ("date",))  # the day of ``ts`` as text
    if "columns" not in kwargs and "covariates" not in kwargs:
        kwargs.update(columns=["count"], covariates=["tmin", "tmax", "pn"])
    return load_forecasting_csv(bikesharing_csv(), **kwargs)


#: ``--dataset`` names of the data sets fetched by ``make install`` (name -> loader, what the summary calls it).
BUILTIN_SOURCES = {
    "appliances_energy": (
        load_appliances_energy,
        "UCI Appliances Energy (built in; 10-minute, 26 channels; noise columns rv1/rv2 dropped)",
    ),
    "electricity": (load_electricity, "hourly electricity (built in; mean load of 321 clients, 2012-2014)"),
    "bikesharing": (
        load_bikesharing,
        "hourly bike rentals (built in; Capital Bikeshare 2010-2019, target count, covariates tmin/tmax/pn)",
    ),
}


def builtin_name(source: Any) -> str | None:
    """``source`` if it names a built-in data set and no file or folder of that name exists, else ``None``."""
    if isinstance(source, str) and source in BUILTIN_SOURCES and not Path(source).exists():
        return source
    return None


def describe_source(source: Any) -> str:
    """What the data summary calls ``source`` (the user's path as given, or a built-in's description)."""
    if source is None:
        return BUILTIN_SOURCES["appliances_energy"][1] + ", the default"
    name = builtin_name(source)
    return BUILTIN_SOURCES[name][1] if name else str(source)


def load_forecasting_csv(path: str | Path, **kwargs: Any) -> datasets.DatasetDict:
    """A CSV file (compressed ones too) -> ``prepare_forecasting``; keyword arguments go there."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV file at {path}")
    if not path.name.lower().endswith(CSV_SUFFIXES):
        raise ValueError(f"{path} is a file but not a CSV ({', '.join(CSV_SUFFIXES)})")
    return prepare_forecasting(read_table(path), **kwargs)


def load_forecasting_dataset(source: Any, **kwargs: Any) -> datasets.DatasetDict:
    """Any forecasting source -> ``prepare_forecasting`` (keyword arguments go there: columns, id_column, ...).

    ``source``: ``None`` (the Appliances Energy default), a built-in name (``BUILTIN_SOURCES``; a file or
    folder of the same name wins), a DataFrame / Dataset / DatasetDict, a CSV or Parquet
    file, a folder written by ``save_to_disk``, any other folder ``datasets.load_dataset`` reads, or a dataset id
    (needs the Hub). A path that does not exist is a ``FileNotFoundError``.
    """
    if source is None:
        return load_appliances_energy(**kwargs)
    if builtin_name(source):
        return BUILTIN_SOURCES[source][0](**kwargs)
    if isinstance(source, (pd.DataFrame, datasets.Dataset, datasets.DatasetDict)):
        return prepare_forecasting(source, **kwargs)
    return prepare_forecasting(read_table(source), **kwargs)
