"""Forecasting data: load (Appliances Energy by default, or the user's), read its layout, split 7:1:2,
standardise, window; classification data (UEA names, .ts/.arff, CSV, datasets folders) padded with masks."""

from ..core.lazy import lazy_exports

#: public name -> the module (relative to this package) defining it; imported on first use, so the command line's
#: data flags (``arguments.py``) are read without pandas or datasets
_EXPORTS = {
    "Layout": ".layout",
    "SPLITS": ".prepare",
    "prepare_forecasting": ".prepare",
    "split_sizes": ".prepare",
    "APPLIANCES_NOISE_COLUMNS": ".sources",
    "BUILTIN_SOURCES": ".sources",
    "describe_source": ".sources",
    "load_appliances_energy": ".sources",
    "load_electricity": ".sources",
    "load_forecasting_csv": ".sources",
    "load_forecasting_dataset": ".sources",
    "Standardization": ".standardize",
    "standardization_of": ".standardize",
    "covariate_note": ".summary",
    "describe_forecasting": ".summary",
    "read_table": ".tables",
    "NUM_TIME_FEATURES": ".time_features",
    "TIME_FEATURES": ".time_features",
    "time_features": ".time_features",
    "ForecastingWindows": ".windows",
    "WindowShape": ".windows",
    "forecasting_windows": ".windows",
    "window_shape": ".windows",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
