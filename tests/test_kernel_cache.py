"""The kernel cache trusts nothing it finds: a truncated or foreign file under the kernel's name is rebuilt (or
refused with one warning), never mapped into the process; a hanging compiler is stopped after its timeout. Loads that
could crash run in a new process, so a SIGBUS fails the test instead of killing pytest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_tensorcompress.runtime import lowbit_kernel

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
        return lowbit_kernel.kernel_path(lowbit_kernel._compiler()[1])
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
    assert lowbit_kernel.verified(target)
    whole = target.read_bytes()
    target.write_bytes(whole[: len(whole) // 3])
    assert product_in_new_process(tmp_path) == BUILT
    assert target.read_bytes() == whole or lowbit_kernel.verified(target)


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
    assert lowbit_kernel.verified(target)


@pytest.mark.slow  # child processes; the journey tier runs the same flows on every push
@needs_kernel
def test_a_foreign_file_with_a_forged_checksum_falls_back_once_then_is_rebuilt(tmp_path):
    target = cached_kernel(tmp_path / "cache")
    target.parent.mkdir(parents=True)
    shutil.copy(foreign_library(tmp_path), target)
    lowbit_kernel._checksum(target).write_text(lowbit_kernel._digest(target))
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
    names = {lowbit_kernel.kernel_path("gcc 12"), lowbit_kernel.kernel_path("gcc 13")}
    monkeypatch.setattr(lowbit_kernel, "FLAGS", (*lowbit_kernel.FLAGS, "-g"))
    names.add(lowbit_kernel.kernel_path("gcc 12"))
    monkeypatch.setattr(lowbit_kernel, "SOURCE", lowbit_kernel.SOURCE + "\n")
    names.add(lowbit_kernel.kernel_path("gcc 12"))
    assert len(names) == 4
