"""Forecasting data: load (Appliances Energy by default, or the user's), read its layout, split 7:1:2,
standardise, window; classification data (UEA names, .ts/.arff, CSV, datasets folders) padded with masks."""

from .layout import Layout
from .prepare import SPLITS, prepare_forecasting, split_sizes
from .sources import (
    APPLIANCES_NOISE_COLUMNS,
    BUILTIN_SOURCES,
    describe_source,
    load_appliances_energy,
    load_electricity,
    load_forecasting_csv,
    load_forecasting_dataset,
)
from .standardize import Standardization, standardization_of
from .summary import describe_forecasting
from .tables import read_table
from .time_features import NUM_TIME_FEATURES, TIME_FEATURES, time_features
from .windows import ForecastingWindows, WindowShape, forecasting_windows, window_shape

__all__ = [
    "SPLITS",
    "APPLIANCES_NOISE_COLUMNS",
    "NUM_TIME_FEATURES",
    "TIME_FEATURES",
    "ForecastingWindows",
    "Layout",
    "Standardization",
    "WindowShape",
    "describe_forecasting",
    "forecasting_windows",
    "load_appliances_energy",
    "load_electricity",
    "BUILTIN_SOURCES",
    "describe_source",
    "load_forecasting_csv",
    "load_forecasting_dataset",
    "prepare_forecasting",
    "read_table",
    "split_sizes",
    "standardization_of",
    "time_features",
    "window_shape",
]
