"""Folders written all or nothing: a save goes to a staging folder beside the target, which replaces the target
only once every file is written, so a failure (an exception, a full disk) leaves the previous folder as it was.

Ships inside saved checkpoints (``save_pretrained`` of the shipped ``Compressed<Base>`` uses it): standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def check_folder_target(target: str | os.PathLike) -> Path:
    """``target`` as a Path, or ``NotADirectoryError`` when a file is in the way (a save never replaces a file)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} is a file, not a folder; pass a folder path to save into")
    return target


@contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a staging folder holding a copy of ``target``'s files; on success it replaces ``target``, on error it
    is removed and ``target`` is untouched. Files already in ``target`` that the save does not rewrite are kept
    (e.g. a tokenizer saved there first)."""
    target = check_folder_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        if target.is_dir():
            shutil.copytree(target, staging, symlinks=True, dirs_exist_ok=True)
        else:
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a saved folder gets the usual mode
        yield staging
        _replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``: the old folder is renamed aside first and restored if the move fails."""
    if not target.exists():
        staging.rename(target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    aside.rmdir()
    target.rename(aside)
    try:
        staging.rename(target)
    except BaseException:
        aside.rename(target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
