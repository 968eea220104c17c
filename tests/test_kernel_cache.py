"""The kernel cache trusts nothing it finds: a truncated or foreign file under the kernel's name is rebuilt (or
refused with one warning), never mapped into the process; a hanging compiler is stopped after its timeout. Loads that
could crash run in a new process, so a SIGBUS fails the test instead of killing pytest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_tensorcompress.runtime import lowbit_kernel, lowbit_kernel_cache

RUNS_HERE = (
    shutil.which("cc") is not None
    and lowbit_kernel.platform.machine() == "x86_64"
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
)
needs_kernel = pytest.mark.skipif(not RUNS_HERE, reason="needs a C compiler and an AVX2 x86 CPU")

PRODUCT = """
import json, warnings
import torch
from hf_tensorcompress.runtime import lowbit_kernel
from hf_tensorcompress.runtime.lowbit import LowBitTensor

torch.manual_seed(0)
stored = LowBitTensor.quantize(torch.randn(64, 64), 4, 64)
hidden = torch.randn(1, 64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    product = stored.matmul_t(hidden)
    product = stored.matmul_t(hidden)
exact = hidden @ stored.dequantize().T
print(json.dumps({
    "kernel": lowbit_kernel.load_kernel() is not None,
    "openmp": bool(lowbit_kernel.load_kernel() and lowbit_kernel.load_kernel().built_with_openmp()),
    "close": torch.allclose(product, exact, rtol=1e-5, atol=1e-4),
    "warnings": [str(w.message) for w in caught],
}))
"""


#: What a product in a new process reports where the kernel builds with OpenMP and gives the torch path's values.
BUILT = {"kernel": True, "openmp": True, "close": True, "warnings": []}


def product_in_new_process(cache: Path, **variables: str) -> dict:
    """One low-bit product in a fresh interpreter with ``cache`` as the cache (and environment ``variables``); a
    crash fails here."""
    env = {**os.environ, "HF_TENSORCOMPRESS_CACHE": str(cache), **variables}
    run = subprocess.run([sys.executable, "-c", PRODUCT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the process died ({run.returncode}): {run.stderr[-2000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def cached_kernel(cache: Path) -> Path:
    """The path the kernel has under ``cache`` for this machine's compiler."""
    previous = os.environ.get("HF_TENSORCOMPRESS_CACHE")
    os.environ["HF_TENSORCOMPRESS_CACHE"] = str(cache)
    try:
        return lowbit_kernel_cache.kernel_path(lowbit_kernel_cache.compiler()[1])
    finally:
        os.environ.pop("HF_TENSORCOMPRESS_CACHE")
        if previous is not None:
            os.environ["HF_TENSORCOMPRESS_CACHE"] = previous


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
@needs_kernel
def test_a_truncated_kernel_is_rebuilt_not_mapped(tmp_path):
    # built by a child: truncating a file this process had mapped would crash it (SIGBUS) at its next page fault
    assert product_in_new_process(tmp_path)["kernel"]
    target = cached_kernel(tmp_path)
    assert lowbit_kernel_cache.verified(target)
    whole = target.read_bytes()
    target.write_bytes(whole[: len(whole) // 3])
    assert product_in_new_process(tmp_path) == BUILT
    assert target.read_bytes() == whole or lowbit_kernel_cache.verified(target)


def foreign_library(folder: Path) -> Path:
    source = folder / "foreign.c"
    source.write_text("int something_else(void) { return 1; }\n")
    library = folder / "foreign.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


@needs_kernel
def test_a_foreign_file_under_the_kernels_name_is_rebuilt(tmp_path):
    target = cached_kernel(tmp_path / "cache")
    target.parent.mkdir(parents=True)
    shutil.copy(foreign_library(tmp_path), target)
    assert product_in_new_process(tmp_path / "cache") == BUILT
    assert lowbit_kernel_cache.verified(target)


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
@needs_kernel
def test_a_foreign_file_with_a_forged_checksum_falls_back_once_then_is_rebuilt(tmp_path):
    target = cached_kernel(tmp_path / "cache")
    target.parent.mkdir(parents=True)
    shutil.copy(foreign_library(tmp_path), target)
    lowbit_kernel_cache.checksum_path(target).write_text(hashlib.sha256(target.read_bytes()).hexdigest())
    refused = product_in_new_process(tmp_path / "cache")
    assert refused["kernel"] is False and refused["close"] is True
    assert len(refused["warnings"]) == 1 and "lacks" in refused["warnings"][0]
    assert product_in_new_process(tmp_path / "cache") == BUILT


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
@needs_kernel
def test_a_compiler_without_openmp_builds_a_one_thread_kernel(tmp_path):
    compiler = tmp_path / "cc-without-openmp"
    compiler.write_text(
        '#!/bin/sh\nfor flag in "$@"; do [ "$flag" = -fopenmp ] && { echo "unsupported: -fopenmp" >&2; exit 1; }; done\n'
        f'exec {shutil.which("cc")} "$@"\n'
    )
    compiler.chmod(0o755)
    assert product_in_new_process(tmp_path / "cache", CC=str(compiler)) == {**BUILT, "openmp": False}
    assert product_in_new_process(tmp_path / "cache") == BUILT  # the machine's own compiler: OpenMP


def test_a_hanging_compiler_is_stopped_after_its_timeout(tmp_path, monkeypatch):
    compiler = tmp_path / "slow-cc"
    compiler.write_text("#!/bin/sh\nsleep 60\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("HF_TENSORCOMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TENSORCOMPRESS_CC_TIMEOUT", "0.5")
    monkeypatch.setattr(lowbit_kernel.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(lowbit_kernel.platform, "machine", lambda: "x86_64")
    lowbit_kernel.load_kernel.cache_clear()
    started = time.monotonic()
    try:
        with pytest.warns(UserWarning, match="longer than 0.5 s") as caught:
            assert lowbit_kernel.load_kernel() is None
            assert lowbit_kernel.load_kernel() is None
    finally:
        lowbit_kernel.load_kernel.cache_clear()
    assert time.monotonic() - started < 10
    assert len(caught) == 1


def test_the_name_changes_with_the_source_the_compiler_and_the_flags(monkeypatch):
    names = {lowbit_kernel_cache.kernel_path("gcc 12"), lowbit_kernel_cache.kernel_path("gcc 13")}
    monkeypatch.setattr(lowbit_kernel_cache, "FLAGS", (*lowbit_kernel_cache.FLAGS, "-g"))
    names.add(lowbit_kernel_cache.kernel_path("gcc 12"))
    monkeypatch.setattr(lowbit_kernel_cache, "SOURCE", lowbit_kernel_cache.SOURCE + "\n")
    names.add(lowbit_kernel_cache.kernel_path("gcc 12"))
    assert len(names) == 4


#: A shared object that someone else planted under the kernel's name: its constructor leaves a file (it runs inside
#: dlopen, before any symbol can be checked), and it exports the kernel's functions, which return garbage.
PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("PLANTED_MARKER");
    FILE *file = marker ? fopen(marker, "w") : NULL;
    if (file) { fputs("ran", file); fclose(file); }
}
void lowbit_matmul_t(void) {}
void codebook_matmul_t(void) {}
void codebook_table(void) {}
void codebook_decode(void) {}
int built_with_openmp(void) { return 1; }
"""

#: One process, one low-bit product per cache folder: what each cache gave (a hang or a crash fails the test).
PRODUCTS = """
import json, os, sys, warnings
import torch
from hf_tensorcompress.runtime import lowbit_kernel
from hf_tensorcompress.runtime.lowbit import LowBitTensor

torch.manual_seed(0)
stored = LowBitTensor.quantize(torch.randn(64, 64), 4, 64)
hidden = torch.randn(1, 64)
report = {}
for case, cache in json.loads(sys.argv[1]).items():
    os.environ["HF_TENSORCOMPRESS_CACHE"] = cache
    os.environ["PLANTED_MARKER"] = os.path.join(cache, "constructor-ran")
    lowbit_kernel.load_kernel.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        product = stored.matmul_t(hidden)
        product = stored.matmul_t(hidden)
    report[case] = {
        "kernel": lowbit_kernel.load_kernel() is not None,
        "close": torch.allclose(product, hidden @ stored.dequantize().T, rtol=1e-5, atol=1e-4),
        "warnings": [str(w.message) for w in caught],
        "constructor_ran": os.path.exists(os.environ["PLANTED_MARKER"]),
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def fake_compiler(tmp_path_factory) -> Path:
    """A ``CC`` that "compiles" by copying the real kernel, built once here (without being mapped by this process):
    each rebuild below then costs a copy, not a compile."""
    folder = tmp_path_factory.mktemp("compiler")
    built = folder / "real-kernel.so"
    (folder / "kernels").mkdir()
    scratch = folder / "kernels" / "lowbit-real.so"
    lowbit_kernel_cache._compile(scratch, shutil.which("cc"), lowbit_kernel_cache.FLAGS)
    shutil.move(scratch, built)
    compiler = folder / "copying-cc"
    compiler.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "copying cc 1.0"; exit 0; }\n'
        'while [ "$#" -gt 1 ]; do [ "$1" = -o ] && exec cp "' + str(built) + '" "$2"; shift; done\nexit 1\n'
    )
    compiler.chmod(0o755)
    return compiler


def planted_library(folder: Path) -> Path:
    source = folder / "planted.c"
    source.write_text(PLANTED_C)
    library = folder / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def plant(kernels: Path, name: str, library: Path, mode: int = 0o755) -> Path:
    """``library`` under the kernel's ``name`` with a matching checksum, as a build would leave it."""
    target = kernels / name
    shutil.copy(library, target)
    target.chmod(mode)
    lowbit_kernel_cache.checksum_path(target).write_text(hashlib.sha256(target.read_bytes()).hexdigest() + "\n")
    return target


@needs_kernel
def test_the_kernel_cache_maps_only_files_this_users_build_wrote(tmp_path, fake_compiler):
    """A planted shared object never runs (its constructor included): not from a folder others can write, not
    through a symlinked folder, not as a file others can write; a FIFO checksum does not block, a link to /dev/zero is
    not read without end. A folder that fails is refused with one warning (torch path); a file that fails is rebuilt."""
    env = {**os.environ, "CC": str(fake_compiler), "HF_TENSORCOMPRESS_CACHE": str(tmp_path / "probe")}
    os.environ["CC"], previous = str(fake_compiler), os.environ.get("CC")
    try:
        name = lowbit_kernel_cache.kernel_path(lowbit_kernel_cache.compiler()[1]).name
    finally:
        os.environ.pop("CC") if previous is None else os.environ.update(CC=previous)
    planted = planted_library(tmp_path)
    caches = {}
    for case in ("group-writable folder", "symlinked folder", "world-writable file", "fifo checksum", "dev-zero link"):
        cache = tmp_path / case.replace(" ", "-")
        cache.mkdir(mode=0o700)
        kernels = cache / "kernels"
        if case == "symlinked folder":
            elsewhere = tmp_path / "elsewhere"
            elsewhere.mkdir(mode=0o700)
            plant(elsewhere, name, planted)
            kernels.symlink_to(elsewhere, target_is_directory=True)
        else:
            kernels.mkdir(mode=0o700)
        if case == "group-writable folder":
            plant(kernels, name, planted)
            kernels.chmod(0o775)
        elif case == "world-writable file":
            plant(kernels, name, planted, mode=0o777)
        elif case == "fifo checksum":
            plant(kernels, name, planted)
            lowbit_kernel_cache.checksum_path(kernels / name).unlink()
            os.mkfifo(lowbit_kernel_cache.checksum_path(kernels / name))
        elif case == "dev-zero link":
            (kernels / name).symlink_to("/dev/zero")
            lowbit_kernel_cache.checksum_path(kernels / name).write_text("0" * 64 + "\n")
        caches[case] = str(cache)
    run = subprocess.run(
        [sys.executable, "-c", PRODUCTS, json.dumps(caches)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for case in ("group-writable folder", "symlinked folder"):  # refused, once, with the fix named; nothing mapped
        entry = report[case]
        assert entry["close"] and not entry["kernel"] and not entry["constructor_ran"], (case, entry)
        assert len(entry["warnings"]) == 1 and "HF_TENSORCOMPRESS_CACHE" in entry["warnings"][0], (case, entry)
    for case in ("world-writable file", "fifo checksum", "dev-zero link"):  # a trusted folder: rebuilt, then used
        assert report[case] == {"kernel": True, "close": True, "warnings": [], "constructor_ran": False}, case
        assert lowbit_kernel_cache.verified(Path(caches[case]) / "kernels" / name), case


def test_only_this_users_files_that_no_one_else_can_write_are_trusted():
    """The ownership rule on the stat fields themselves (another user's file cannot be made without root)."""

    def status(uid: int, mode: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))

    me = os.getuid()
    assert lowbit_kernel_cache._owned_by_this_user(status(me, 0o100755))
    assert not lowbit_kernel_cache._owned_by_this_user(status(me + 1, 0o100755))  # another user's
    assert not lowbit_kernel_cache._owned_by_this_user(status(me, 0o100775))  # group-writable
    assert not lowbit_kernel_cache._owned_by_this_user(status(me, 0o100757))  # world-writable
