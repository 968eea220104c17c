"""Folders written all or nothing: a save goes to a staging folder beside the target, which then takes the target's
place in one step, so the target always holds the previous or the new complete checkpoint.

Where the target cannot be renamed (a mount point, the working directory, a folder holding it) the new files are
staged inside it and renamed into place one by one, ``config.json`` last after the old one is removed: a partial
state has no config and cannot load as a mix. Every staging name carries the writer's token (its process id and a
random part), and the writer holds a lock (``flock``) on ``<prefix>.<token>.lock`` beside its staging folders for as
long as they exist, so the next save or load of that path (``recover``) finishes or removes what a killed process
left, and never touches a live save's files, even one of another PID namespace (another container on a shared
volume), where the process id means nothing. Only staging folders without a lock file (an earlier version's) are
judged by their process id. Kept files (a tokenizer saved there first) are hard-linked, not copied: a re-save needs no
second copy.

Ships inside saved checkpoints (``save_pretrained`` of the shipped ``Compressed<Base>`` uses it): standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; staging folders are judged by their process id there
    fcntl = None

#: Name of the staging folder an in-place save makes inside its target.
IN_PLACE = ".tensorcompress"

#: What an in-place staging folder is renamed to once every file is written: from then on it is moved in, not removed.
READY = "ready"

#: What a writer's lock file is named before it is locked (``_writer_lock``): a writer killed that early leaves it.
LOCKING = "locking"

#: What a staging name ends in: a folder being written, the old folder renamed aside, an in-place folder written in
#: full, the writer's lock, its lock file not yet locked.
KINDS = ("partial", "old", READY, "lock", LOCKING)

#: Suffixes of the files (not folders) among those names.
LOCK_SUFFIXES = (".lock", f".{LOCKING}")

#: Weight files of a checkpoint (whole, sharded, their index): a save that writes weights keeps none of the old
#: ones, so an old ``model.safetensors`` never shadows new shards (or old shards outlive a new single file).
WEIGHTS = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?")


def check_folder_target(target: str | os.PathLike) -> Path:
    """``target`` as a Path, or ``NotADirectoryError`` when a file is in the way (a save never replaces a file)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} is a file, not a folder; pass a folder path to save into")
    return target


@contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder; on success its files replace ``target``'s, on error it is removed and
    ``target`` is untouched. Files already in ``target`` that the save does not write are kept. A symlinked target
    is written through: the link stays a link."""
    target = Path(os.path.realpath(check_folder_target(target)))
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    in_place = target.is_dir() and _unmovable(target)
    prefix = target / IN_PLACE if in_place else target.parent / f".{target.name}"
    with _writer_lock(prefix) as token:
        staging = Path(f"{prefix}.{token}.partial")
        staging.mkdir()
        if target.is_dir():
            shutil.copymode(target, staging)
        try:
            yield staging
            if in_place:
                _move_in(staging.rename(staging.with_suffix(f".{READY}")), target)
            else:
                _swap(staging, target, token)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


@contextmanager
def _writer_lock(prefix: Path) -> Iterator[str]:
    """This writer's token ``<pid>.<random>`` for its staging names, with ``<prefix>.<token>.lock`` locked until the
    block ends (then removed): the proof, to any process that can read the folder, that the writer is alive. The
    file is locked under a temporary name and renamed into place, so no one sees a ``.lock`` unlocked while its writer
    lives. A temporary file seen unlocked is taken for a killed writer's and removed (``recover``); if its writer was
    alive, about to lock it, the rename fails and the writer starts again under a new name."""
    while True:
        token = f"{os.getpid()}.{secrets.token_hex(4)}"
        pending, lock = Path(f"{prefix}.{token}.{LOCKING}"), Path(f"{prefix}.{token}.lock")
        try:
            descriptor = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
        except FileExistsError:
            continue
        try:
            if fcntl is not None:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            os.rename(pending, lock)
            break
        except FileNotFoundError:  # a ``recover`` took it, still unlocked, for a killed writer's: start again
            os.close(descriptor)
        except BaseException:
            pending.unlink(missing_ok=True)
            os.close(descriptor)
            raise
    try:
        yield token
    finally:
        for path in (pending, lock):
            path.unlink(missing_ok=True)
        os.close(descriptor)


def recover(target: str | os.PathLike) -> None:
    """Finish or undo what killed saves of ``target`` left: restore the previous folder a save had renamed aside
    when the target is missing, move in the files of an in-place save that had written them all, and remove the rest.
    Leftovers of live processes are left alone."""
    target = Path(os.path.realpath(target))
    aside = sorted(_dead(target.parent, f".{target.name}"), key=lambda path: path.stat().st_mtime)
    aside = [path for path in aside if path.suffix not in LOCK_SUFFIXES]
    if not target.exists():
        old = [path for path in aside if path.suffix == ".old"]
        if old:
            old[-1].rename(target)
            aside.remove(old[-1])
    for path in aside:
        shutil.rmtree(path, ignore_errors=True)
    if target.is_dir():
        for path in _dead(target, IN_PLACE):
            if path.suffix == f".{READY}":
                _move_in(path, target)
            elif path.suffix not in LOCK_SUFFIXES:
                shutil.rmtree(path, ignore_errors=True)
    for folder, prefix in ((target.parent, f".{target.name}"), (target, IN_PLACE)):
        for lock in [path for path in _dead(folder, prefix) if path.suffix in LOCK_SUFFIXES]:
            lock.unlink(missing_ok=True)  # its writer's folders are handled above


def _dead(folder: Path, prefix: str) -> list[Path]:
    """Staging folders (and lock files) named ``<prefix>.<pid>.<random>.<kind>`` in ``folder`` whose writer is gone:
    nothing holds the writer's lock (``_writer_lock``); where there is no lock file (an earlier version's save, or a
    system without ``flock``), its process has ended."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        parts = name[len(prefix) + 1 :].split(".") if name.startswith(prefix + ".") else []
        if len(parts) == 3 and parts[0].isdigit() and parts[2] in KINDS:
            path = folder / name
            is_file = path.suffix in LOCK_SUFFIXES
            lock = path if is_file else folder / f"{prefix}.{parts[0]}.{parts[1]}.lock"
            if (path.is_dir() or is_file) and _writer_gone(lock):
                found.append(path)
    return found


def _writer_gone(lock: Path) -> bool:
    """Whether the writer whose lock file is ``lock`` has ended: no process holds the lock (a process of any PID
    namespace that can reach the file holds it while it writes); without a lock file, its process id is no longer
    alive here."""
    pid = int(lock.name.split(".")[-3])
    if fcntl is None:
        return not _alive(pid)
    try:
        descriptor = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return not _alive(pid)
    except OSError:
        return False  # cannot tell: leave it
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: the writer is alive
    finally:
        os.close(descriptor)
    return True


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # Windows' os.kill would terminate the process, not probe it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _unmovable(target: Path) -> bool:
    """Whether renaming ``target`` would fail (a mount point: EBUSY; a parent this user cannot write) or strand this
    process (it is or holds the working directory)."""
    cwd = Path(os.path.realpath(os.getcwd()))
    return os.path.ismount(target) or cwd == target or target in cwd.parents or not os.access(target.parent, os.W_OK)


def _swap(staging: Path, target: Path, token: str) -> None:
    """Put ``staging`` at ``target``, carrying over (hard-linked) the old files it does not replace; the old folder
    is exchanged with the new in one step where the system can (Linux), else renamed aside first. Either way a
    killed process leaves the old or the new folder at ``target``, or the old one aside for ``recover``."""
    if not target.exists():
        staging.rename(target)
        return
    _carry_over(target, staging)
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # now the old folder
        return
    aside = target.parent / f".{target.name}.{token}.old"  # this writer's name: its lock covers it
    target.rename(aside)
    try:
        staging.rename(target)
    except BaseException:
        aside.rename(target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _carry_over(old: Path, new: Path) -> None:
    """Link into ``new`` every entry of ``old`` it lacks (but the old weights when ``new`` holds weights)."""
    weights = _has_weights(new)
    for entry in os.scandir(old):
        source, destination = Path(entry.path), new / entry.name
        if destination.exists() or destination.is_symlink() or (weights and WEIGHTS.fullmatch(entry.name)):
            continue
        if entry.name.startswith(IN_PLACE + "."):  # another writer's in-place staging: not part of the checkpoint
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(source), destination)
        elif entry.is_dir():
            shutil.copytree(source, destination, symlinks=True, copy_function=_link)
        else:
            _link(source, destination)


def _link(source: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Hard link, or a copy where the file system has none."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _has_weights(folder: Path) -> bool:
    return any(WEIGHTS.fullmatch(name) for name in os.listdir(folder))


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_cwd, exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def _move_in(ready: Path, target: Path) -> None:
    """Rename every file of a fully written in-place staging folder into ``target``: the old ``config.json`` first
    out, the new one last in, so no moment holds a config beside weights of another save. Safe to run again after
    a kill (``recover``)."""
    names = os.listdir(ready)
    if "config.json" in names:
        (target / "config.json").unlink(missing_ok=True)
    if _has_weights(ready):
        for name in os.listdir(target):
            if WEIGHTS.fullmatch(name) and name not in names:
                (target / name).unlink()
    for name in sorted(names, key=lambda name: name == "config.json"):
        destination = target / name
        if (ready / name).is_dir() and destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        os.replace(ready / name, destination)
    ready.rmdir()
