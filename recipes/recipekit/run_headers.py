"""The line printed before each run of a recipe of several runs: where it is and how long is left."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from accelerate import PartialState


def run_header(index: int, total: int, name: str, seconds: list[float]) -> str:
    """``[2/6] smartformer: about 2.2 min, 11 min left in all``. The estimate is the mean wall time of the runs
    before it (every run trains for the same steps; a search run costs about as much as a fixed-rank one), so the
    first run has none."""
    if not seconds:
        return f"[{index}/{total}] {name}: time estimate after this run"
    mean = sum(seconds) / len(seconds)
    return f"[{index}/{total}] {name}: about {mean / 60:.1f} min, {mean * (total - index + 1) / 60:.0f} min left in all"


class RunHeaders:
    """Announces each of ``total`` runs (main process only) and times it for the next estimate."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.seconds: list[float] = []

    @contextmanager
    def run(self, name: str) -> Iterator[None]:
        if PartialState().is_main_process:
            print(run_header(len(self.seconds) + 1, self.total, name, self.seconds), flush=True)
        started = time.monotonic()
        yield
        self.seconds.append(time.monotonic() - started)
