"""What a test run builds once, for all its xdist workers: the first worker to ask builds it in the run's shared
folder (the ``run_folder`` fixture), the others wait for it and read it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def once(run_folder: Path, name: str, build: Callable[[], object]) -> object:
    """``build()``'s result (JSON), computed by the first worker of the run that asks and read by the others."""
    result = run_folder / f"{name}.json"
    with FileLock(str(run_folder / f"{name}.lock")):
        if not result.exists():
            result.write_text(json.dumps(build()))
    return json.loads(result.read_text())
