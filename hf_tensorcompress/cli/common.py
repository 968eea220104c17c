"""What every subcommand shares: the program's name, the user-mistake error, the tokenizer saved with a model."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

PROG = "hf-tensorcompress"


class UsageError(Exception):
    """A mistake in what the user asked for; reported as one line, exit code 2."""


def quoted(*values: object) -> str:
    """Values as they are typed in a shell (``'Unnamed: 0'`` quoted), so a hint can be pasted as it is."""
    return " ".join(shlex.quote(str(value)) for value in values)


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts (tokens, windows, steps): an int >= 1, checked before anything loads."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def existing_folder(path: str, what: str = "a model folder (with config.json)") -> Path:
    """``path`` as a folder that exists, checked before anything loads (a save killed mid-way is recovered first)."""
    from ..runtime.atomic import recover  # the standard library only

    folder = Path(path)
    try:
        recover(folder)
    except OSError:
        pass
    if not folder.is_dir():
        raise UsageError(f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}; pass {what}")
    return folder


def tokenizer_of(source: Path):
    """The tokenizer stored with a model folder or GGUF file, or None (time-series models have none)."""
    from transformers import AutoTokenizer

    if source.suffix != ".gguf" and not any(source.glob("tokenizer*")):
        return None
    try:
        if source.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError, KeyError, TypeError):
        return None
