"""Progress bars for the compression steps that can run for minutes (k-means, GPTQ/GPTVQ blocks, calibration, one
module after another): tqdm bars that appear in a terminal once a step has run for ``DELAY`` seconds, so quick
steps print nothing. Build-time only (never shipped in a checkpoint).

``HF_TENSORCOMPRESS_PROGRESS=1`` shows every bar at once, also where stderr is not a terminal (a log file, a test);
``HF_TENSORCOMPRESS_PROGRESS=0`` hides them all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tqdm.auto import tqdm

#: The environment variable that forces the bars on (``1``) or off (``0``); unset, they show in a terminal only.
PROGRESS_ENV = "HF_TENSORCOMPRESS_PROGRESS"

#: Seconds a step runs before its bar appears (a bar for a step that ends sooner is never drawn).
DELAY = 2.0


def forced() -> bool | None:
    """True or False where ``PROGRESS_ENV`` forces the bars on or off, None where it is unset (or unreadable)."""
    setting = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if setting in ("1", "true", "yes", "on"):
        return True
    if setting in ("0", "false", "no", "off"):
        return False
    return None


def progress(iterable: Iterable | None = None, *, desc: str, total: int | None = None, unit: str = "it") -> tqdm:
    """A tqdm bar over ``iterable`` (or one to ``update`` by hand up to ``total``): drawn on stderr in a terminal
    after ``DELAY`` seconds, at once when forced on, never when forced off; removed when done (``leave=False``), so
    nested steps leave only the outer bar's last state."""
    force = forced()
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        leave=False,
        disable=None if force is None else not force,  # None: tqdm draws only where stderr is a terminal
        delay=0 if force else DELAY,
        mininterval=0.5,
    )
