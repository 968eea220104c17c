"""Build the fused CPU kernels once per machine, and map only a file this user's own build wrote.

The shared object is compiled with the system C compiler into ``kernel_dir()`` (``$HF_TENSORCOMPRESS_CACHE/kernels``,
default ``~/.cache/hf_tensorcompress/kernels``) under a name that hashes the C source, the compiler and the flags;
the SHA-256 of its bytes is written beside it (``.sha256``) when it is built. Mapping a shared object runs its code
(its constructors run inside ``dlopen``, before any symbol can be checked), so a cached file is loaded only when

- its folder is a directory, not a symbolic link, owned by this user and writable by no one else;
- the file and its checksum are regular files (no link followed, no FIFO or device opened: ``O_NOFOLLOW |
  O_NONBLOCK``), owned by this user, writable by no one else, and no larger than a kernel can be;
- the SHA-256 of the bytes read matches the checksum, and the library is mapped from the very descriptor those
  bytes were read through (``/proc/self/fd/N``), so a file swapped after the check is not the one that runs.

Inside a trusted folder, a file that fails (missing, truncated, foreign, a link, a FIFO) is rebuilt and renamed over;
a folder that fails is left alone (``UntrustedCacheError``): the caller takes the torch path, with one warning that
names the folder and the fix.

Ships inside saved checkpoints that store packed codes: standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

from .lowbit_kernel_source import SOURCE

#: Compiler flags; part of the cached file's name, so changing them builds a new file. Where the compiler has no
#: OpenMP, the library is built without ``-fopenmp`` and runs on one thread.
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-fopenmp")

#: The functions a loaded library must export (a foreign file under the kernel's name has other ones).
SYMBOLS = (
    "lowbit_matmul_t",
    "lowbit_decode",
    "codebook_matmul_t",
    "codebook_table",
    "codebook_decode",
    "tiered_decode",
    "built_with_openmp",
)

#: Largest file read as a kernel (the real one is about 100 KB) and as its checksum: a link to ``/dev/zero`` or a
#: huge planted file is refused after this many bytes, not read without end.
MAX_LIBRARY_BYTES = 16 << 20
MAX_CHECKSUM_BYTES = 256

#: Permission bits that let another user change a file or folder.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UntrustedCacheError(RuntimeError):
    """The kernel folder could hold files another user wrote: nothing in it is built, read or mapped."""


def kernel_dir() -> Path:
    cache = os.environ.get("HF_TENSORCOMPRESS_CACHE", Path.home() / ".cache" / "hf_tensorcompress")
    return Path(cache) / "kernels"


def compiler_timeout() -> float:
    """Seconds a compiler call may take (``HF_TENSORCOMPRESS_CC_TIMEOUT``, default 120): a hanging ``CC`` must not
    hang the model's first forward."""
    return float(os.environ.get("HF_TENSORCOMPRESS_CC_TIMEOUT", "120"))


def _run(command: list[str]) -> str:
    """``command``'s stdout; RuntimeError when it fails or outlives ``compiler_timeout()`` (its whole process group
    is killed then, so a wrapper script's children do not linger)."""
    timeout = compiler_timeout()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            if hasattr(os, "killpg"):
                os.killpg(process.pid, signal.SIGKILL)
            else:  # Windows: no process groups
                process.kill()
            process.communicate()
            raise RuntimeError(f"{command[0]} ran longer than {timeout:g} s (HF_TENSORCOMPRESS_CC_TIMEOUT)") from None
    if process.returncode:
        raise RuntimeError(f"{command[0]} failed: {err.strip()[-500:]}")
    return out


def compiler() -> tuple[str, str]:
    """The C compiler to call and what identifies its output: resolved path and ``--version`` text."""
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    return found, os.path.realpath(found) + "\n" + _run([found, "--version"])


def kernel_path(identity: str, flags: tuple[str, ...] | None = None) -> Path:
    """The cached file for this source, compiler ``identity`` and ``flags`` (default ``FLAGS``): any change gets a
    new name."""
    key = hashlib.sha256("\0".join([SOURCE, identity, *(FLAGS if flags is None else flags)]).encode()).hexdigest()[:16]
    return kernel_dir() / f"lowbit-{key}.so"


def checksum_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _owned_by_this_user(status: os.stat_result) -> bool:
    """Owned by this user and writable by no one else (where there are no user ids, as on Windows: not checked)."""
    return not hasattr(os, "getuid") or (status.st_uid == os.getuid() and not status.st_mode & OTHERS_WRITE)


def trusted_folder(folder: Path) -> None:
    """Create ``folder`` (mode 0700) if it is missing; ``UntrustedCacheError`` unless it is a directory, not a
    link, owned by this user and writable by no one else."""
    try:
        folder.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    status = os.lstat(folder)
    if stat.S_ISLNK(status.st_mode) or not stat.S_ISDIR(status.st_mode) or not _owned_by_this_user(status):
        owner = f"owned by uid {status.st_uid}, " if hasattr(os, "getuid") else ""
        raise UntrustedCacheError(
            f"the kernel cache {folder} ({owner}mode {stat.filemode(status.st_mode)}) is not a folder of this user's "
            "that no one else can write, so nothing in it is loaded; set HF_TENSORCOMPRESS_CACHE to a folder of your "
            f"own, or make it yours: chmod go-w {folder}"
        )


def _open_regular(path: Path, limit: int) -> tuple[int, bytes] | None:
    """A descriptor of ``path`` and its bytes, where it is a regular file of this user's that no one else can write,
    of at most ``limit`` bytes; None otherwise (a link, a FIFO, a device, another user's, too large). Never blocks
    and never follows a link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or not _owned_by_this_user(status) or status.st_size > limit:
            raise OSError("not a trusted file")
        data = b""
        while len(data) <= limit:
            chunk = os.read(descriptor, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise OSError("larger than a kernel")
        return descriptor, data
    except OSError:
        os.close(descriptor)
        return None


def _verified_descriptor(target: Path) -> int | None:
    """An open descriptor of ``target`` where it is the file a build wrote (its checksum matches the bytes read
    through this descriptor, both files trusted by ``_open_regular``), else None."""
    checksum = _open_regular(checksum_path(target), MAX_CHECKSUM_BYTES)
    if checksum is None:
        return None
    os.close(checksum[0])
    library = _open_regular(target, MAX_LIBRARY_BYTES)
    if library is None:
        return None
    if checksum[1].decode("ascii", "replace").strip() != hashlib.sha256(library[1]).hexdigest():
        os.close(library[0])
        return None
    return library[0]


def verified(target: Path) -> bool:
    """Whether ``target`` is the file a build wrote: a truncated or replaced file is rebuilt instead of mapped, which
    would crash the process (SIGBUS) or run foreign code."""
    descriptor = _verified_descriptor(target)
    if descriptor is None:
        return False
    os.close(descriptor)
    return True


def _compile(target: Path, compiler_path: str, flags: tuple[str, ...]) -> None:
    """Build the shared library into ``target`` and its checksum beside it (temporary names renamed into place:
    processes that compile at the same time each finish with whole files; no one else may write either)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        source, built = Path(scratch) / "lowbit.c", Path(scratch) / target.name
        source.write_text(SOURCE)
        _run([compiler_path, *flags, str(source), "-o", str(built)])
        checksum = Path(scratch) / "checksum"
        checksum.write_text(hashlib.sha256(built.read_bytes()).hexdigest() + "\n")
        built.chmod(0o755)
        checksum.chmod(0o644)
        os.replace(built, target)
        os.replace(checksum, checksum_path(target))


def _map(target: Path, descriptor: int) -> ctypes.CDLL:
    """``dlopen`` of the file behind ``descriptor`` (the bytes just verified), by its ``/proc/self/fd`` path where the
    system has one; the descriptor is closed after."""
    try:
        by_descriptor = f"/proc/self/fd/{descriptor}"
        return ctypes.CDLL(by_descriptor if os.path.exists(by_descriptor) else str(target))
    finally:
        os.close(descriptor)


def build_or_load() -> tuple[ctypes.CDLL, Path]:
    """The kernel library and its file: the cached one where it verifies, else built first (with OpenMP, or where
    the compiler has none, without). RuntimeError (``UntrustedCacheError`` among them) where it cannot be had."""
    compiler_path, identity = compiler()
    trusted_folder(kernel_dir())
    serial = tuple(flag for flag in FLAGS if flag != "-fopenmp")  # a compiler without OpenMP: one thread
    candidates = (kernel_path(identity), kernel_path(identity, serial))
    found = [(target, _verified_descriptor(target)) for target in candidates]
    target, descriptor = next(((t, d) for t, d in found if d is not None), (candidates[0], None))
    for other, unused in found:
        if unused is not None and other != target:
            os.close(unused)
    if descriptor is None:
        try:
            _compile(target, compiler_path, FLAGS)
        except RuntimeError:
            target = candidates[1]
            _compile(target, compiler_path, serial)
        descriptor = _verified_descriptor(target)
        if descriptor is None:
            raise RuntimeError(f"the kernel just built at {target} does not verify; was the folder changed meanwhile?")
    library = _map(target, descriptor)
    missing = [name for name in SYMBOLS if not hasattr(library, name)]
    if missing:  # a foreign file under our checksum: removed, so the next process builds the kernel
        target.unlink(missing_ok=True)
        raise RuntimeError(f"{target} lacks {missing}; removed, the next process rebuilds it")
    return library, target
