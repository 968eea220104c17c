"""``main``: run one subcommand; a user mistake ends with one ``error:`` line and exit code 2, only bugs show a
traceback."""

from __future__ import annotations

import errno
import sys

from ..config import config_classes
from ..core.extras import MissingExtraError
from .common import PROG, UsageError
from .config_flags import config_flags, method_of
from .messages import in_flag_terms
from .parser import parse

#: The library's top-level package (the modules defining error types are looked up there).
PACKAGE = __package__.rpartition(".")[0]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.handler(args)
    except Exception as error:
        code = exit_code(error)
        if code is None:
            raise
        return _fail(args, error, code)


def exit_code(error: Exception) -> int | None:
    """2 for the user's mistakes; 1 for a failed download, a missing optional extra or a full disk; None for bugs
    (traceback). The modules defining the error types are only consulted if a command already imported them."""
    assets = sys.modules.get(f"{PACKAGE}.assets")
    if assets is not None and isinstance(error, assets.AssetError):
        return 1  # a registry download failed: not the user's mistake, but no traceback either
    if isinstance(error, MissingExtraError) or _disk_full(error):
        return 1
    hub = sys.modules.get(f"{PACKAGE}.hub")
    if isinstance(error, (UsageError, ValueError, FileNotFoundError, FileExistsError)) or (
        hub is not None and isinstance(error, hub.PushError)
    ):
        return 2
    return None


def _disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is a full disk: an OSError, or safetensors' error quoting the OS's."""
    while error is not None:
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _fail(args, error: Exception, code: int) -> int:
    message = " ".join(str(error).split())
    if args.command == "compress":  # the library's config errors name fields; the user typed flags
        cls = config_classes().get(method_of(args))
        message = in_flag_terms(message, config_flags(), cls.field_names() if cls else ())
    print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
    return code
