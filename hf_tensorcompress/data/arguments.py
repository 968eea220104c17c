"""The data flags every recipe shares, so a user's file is read the same way by each (and by the library API):
``--dataset`` plus the ``Layout`` of a forecasting table, or the columns of a classification table. Defining the flags
imports neither pandas nor datasets (the command line's ``--help``); reading the data does.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets


def add_forecasting_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data (forecasting)")
    group.add_argument(
        "--dataset",
        default=None,
        help="CSV or Parquet file, a datasets folder, a datasets id, or a built-in data set: appliances_energy "
        "(the default) or electricity (hourly, 2012-2014)",
    )
    group.add_argument(
        "--timestamp-column", default="auto", help="the date column ('auto' finds one; 'none': no time axis)"
    )
    group.add_argument(
        "--timestamp-columns",
        nargs="+",
        default=None,
        metavar="COLUMN",
        help="calendar columns combined into the time axis, in the order year month day [hour [minute [second]]]",
    )
    group.add_argument(
        "--id-column",
        default=None,
        help="long format (one row per time and series): the series id; pivoted to one channel per series",
    )
    group.add_argument(
        "--target",
        "--columns",
        dest="columns",
        nargs="+",
        default=None,
        metavar="COLUMN",
        help="channels to forecast and score (default: every numeric column not named elsewhere)",
    )
    group.add_argument(
        "--covariates", nargs="+", default=None, metavar="COLUMN", help="channels fed to the model but not scored"
    )
    group.add_argument("--drop-columns", nargs="+", default=None, metavar="COLUMN", help="columns to leave out")
    group.add_argument(
        "--one-hot",
        nargs="+",
        default=None,
        metavar="COLUMN",
        help="categorical columns to encode as 0/1 channels (otherwise a text column is an error)",
    )
    group.add_argument(
        "--sort-timestamps", action="store_true", help="sort rows by time (otherwise unsorted rows are an error)"
    )


def forecasting_options(args: argparse.Namespace) -> dict:
    """The ``prepare_forecasting`` keywords the user set (unset ones keep the source's defaults)."""
    options = {
        "timestamp_columns": args.timestamp_columns,
        "id_column": args.id_column,
        "columns": args.columns,
        "covariates": args.covariates,
        "drop_columns": args.drop_columns,
        "one_hot": args.one_hot,
        "sort_timestamps": args.sort_timestamps or None,
    }
    options = {key: value for key, value in options.items() if value is not None}
    if args.timestamp_column != "auto":
        options["timestamp_column"] = None if args.timestamp_column.lower() == "none" else args.timestamp_column
    return options


def load_forecasting_from_args(args: argparse.Namespace) -> datasets.DatasetDict:
    from .sources import load_forecasting_dataset

    return load_forecasting_dataset(args.dataset, **forecasting_options(args))


def add_classification_arguments(
    parser: argparse.ArgumentParser, default: str | None = "JapaneseVowels", with_forecasting: bool = False
) -> None:
    """``with_forecasting``: the parser already has the forecasting flags (a script with both kinds of task), whose
    ``--dataset`` and ``--id-column`` (the series id of long data) serve classification too."""
    group = parser.add_argument_group("data (classification)")
    if not with_forecasting:
        group.add_argument(
            "--dataset",
            default=default,
            help="a UEA/UCR name (aeon), a .ts/.arff file, a CSV/Parquet table, or a datasets folder/id",
        )
        group.add_argument(
            "--id-column",
            default=None,
            help="long tables (one row per time step): the series id column; without it a table is "
            "wide (one row per series, one column per step)",
        )
    group.add_argument(
        "--test-dataset",
        default=None,
        help="the test data in the same form (default: the source's own test split, else a stratified 25%%)",
    )
    group.add_argument("--label-column", default="label", help="tables: the class column")
    group.add_argument("--time-column", default=None, help="long tables: the column giving the order of the steps")
    group.add_argument(
        "--validation", type=float, default=0.2, help="stratified share of train held out for model selection"
    )


def load_classification_from_args(args: argparse.Namespace) -> datasets.DatasetDict:
    from .classification import SeriesColumns, load_classification_dataset

    columns = SeriesColumns(args.label_column, args.id_column, args.time_column)
    return load_classification_dataset(
        args.dataset, test_source=args.test_dataset, columns=columns, validation=args.validation
    )
