"""Calendar features of each time step for Autoformer/Informer, scaled to [-0.5, 0.5] as GluonTS does.

Written here because transformers leaves time features to the caller (its examples use GluonTS, which is not a
dependency). Every feature is computed for every frequency; features that do not vary simply stay constant.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TIME_FEATURES = ("minute_of_hour", "hour_of_day", "day_of_week", "day_of_month", "day_of_year")
#: Set ``num_time_features`` of an Autoformer/Informer config to this.
NUM_TIME_FEATURES = len(TIME_FEATURES)


def time_features(timestamps: np.ndarray | pd.Series) -> np.ndarray:
    """(steps, NUM_TIME_FEATURES) float32 array for an array of timestamps."""
    index = pd.DatetimeIndex(timestamps)
    columns = (
        index.minute / 59.0,
        index.hour / 23.0,
        index.dayofweek / 6.0,
        (index.day - 1) / 30.0,
        (index.dayofyear - 1) / 365.0,
    )
    return (np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1) - 0.5).astype(np.float32)
