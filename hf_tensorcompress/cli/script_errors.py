"""User mistakes in scripts end like the CLI's: one ``<prog>: error: ...`` line and exit code 2, no traceback.

Only the part of a script that reads the user's inputs (flags, files, data) runs under ``user_errors``; a failure
later (training, saving) is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: Exceptions raised for inputs that cannot be used (missing files and folders are OSErrors; messages name the fix).
USER_ERRORS = (ValueError, OSError, KeyError)


@contextmanager
def user_errors(prog: str) -> Iterator[None]:
    """Turn ``USER_ERRORS`` raised inside the block into ``prog: error: <message>`` on stderr and exit code 2."""
    try:
        yield
    except USER_ERRORS as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
        raise SystemExit(2) from None
