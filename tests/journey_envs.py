"""The Python environments the journey tier runs user flows in, built by the tests and cached between runs.

- ``full``: the test run's own interpreter (the library with every extra);
- ``minimal``: ``pip install .`` without extras (the library and its core dependencies, no torchao, gguf, …);
- ``bare``: torch + transformers + safetensors only, as where a checkpoint with remote code is deployed;
- ``bare_torchao``: bare plus torchao, for checkpoints whose Linear weights torchao quantized.

The versions of torch, transformers, safetensors and torchao are the ones this interpreter has, so outputs can be
compared across environments. Environments are layered (a ``.pth`` file puts the site-packages of the venvs below on
their path; pip sees those packages as installed), so torch is installed once: ``bare_torchao`` and the library's
core dependencies on ``bare``. These live in ``$HF_TENSORCOMPRESS_CACHE/journey-envs/<key>`` (default
``~/.cache/hf_tensorcompress``) and never hold the library: ``minimal`` (and the no-torch ``onnx_runtime``) is a
venv of the test run's own, in a folder every xdist worker of the run shares, with this checkout's wheel installed
over the cached layers, so runs of other checkouts sharing the cache cannot change it under a running test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
PINNED = ("torch", "transformers", "safetensors", "huggingface_hub", "tokenizers")


def cache_root() -> Path:
    base = os.environ.get("HF_TENSORCOMPRESS_CACHE", Path.home() / ".cache" / "hf_tensorcompress")
    return Path(base) / "journey-envs"


def requirement(name: str) -> str:
    """``name==<this interpreter's version>`` without a local tag (``2.13.0+cpu`` → ``2.13.0``)."""
    return f"{name}=={version(name).split('+')[0]}"


def env_key() -> str:
    pins = [sys.version, *(requirement(name) for name in (*PINNED, "torchao"))]
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def site_packages(folder: Path) -> Path:
    """The venv's purelib folder (``lib/pythonX.Y/site-packages``)."""
    relative = Path(sysconfig.get_path("purelib", vars={"base": "", "platbase": ""}).lstrip("/"))
    return folder / relative


def _run(*command: str | Path) -> None:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(map(str, command))} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def _venv(folder: Path, layered_on: tuple[Path, ...] = (), pip: bool = True) -> None:
    """A fresh venv at ``folder``; the packages of the ``layered_on`` venvs are importable from it too."""
    shutil.rmtree(folder, ignore_errors=True)
    _run(sys.executable, "-m", "venv", *(() if pip else ("--without-pip",)), folder)
    if layered_on:
        (site_packages(folder) / "_journey_base.pth").write_text("".join(f"{site_packages(v)}\n" for v in layered_on))


def _pip(folder: Path, *arguments: str | Path) -> None:
    """``pip install`` into the venv at ``folder`` (this interpreter's pip, so the venv needs none of its own)."""
    _run(sys.executable, "-m", "pip", "--python", python_of(folder), "install", "-q", "--disable-pip-version-check",
         *arguments)  # fmt: skip


def library_wheel(scratch: Path) -> Path:
    """A wheel of this checkout in ``scratch``, built from a copy (no build files left in the repo); built once per
    folder (a lock keeps two processes from building it at once)."""
    with FileLock(str(scratch / "wheel.lock")):
        built = sorted(scratch.glob("hf_tensorcompress-*.whl"))
        if built:
            return built[0]
        source = scratch / "source"
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "outputs", "site", "__pycache__"))
        _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", source, "-w", scratch)
        shutil.rmtree(source)
        return next(scratch.glob("hf_tensorcompress-*.whl"))


def _with_library(folder: Path, layers: tuple[Path, ...], wheel: Path, *flags: str) -> Path:
    """A venv at ``folder`` over the cached ``layers`` holding this checkout's library (``wheel``): the cached venvs
    never hold the library, so concurrent test runs (other checkouts, other xdist workers) cannot swap it under a
    running step."""
    _venv(folder, layered_on=layers, pip=False)
    _pip(folder, *flags, wheel)
    return python_of(folder)


def build_environments(run_folder: Path) -> dict[str, Path]:
    """``{name: python executable}`` for full, minimal, bare and bare_torchao: bare and bare_torchao cached (built
    where missing), minimal this checkout's library in ``run_folder`` over its cached dependencies."""
    root = cache_root() / env_key()
    root.mkdir(parents=True, exist_ok=True)
    bare, torchao, dependencies = root / "bare", root / "bare_torchao", root / "minimal_dependencies"
    wheel = library_wheel(run_folder)
    with FileLock(str(root / ".lock")):
        if not (bare / ".complete").exists():
            _venv(bare)
            _pip(bare, *(requirement(name) for name in PINNED))
            (bare / ".complete").touch()
        if not (torchao / ".complete").exists():
            _venv(torchao, layered_on=(bare,))
            _pip(torchao, "--no-deps", requirement("torchao"))
            (torchao / ".complete").touch()
        if not (dependencies / ".complete").exists():  # the library's core dependencies, without the library
            _venv(dependencies, layered_on=(bare,))
            _pip(dependencies, wheel)
            _run(sys.executable, "-m", "pip", "--python", python_of(dependencies), "uninstall", "-q", "-y",
                 "hf_tensorcompress")  # fmt: skip
            (dependencies / ".complete").touch()
    # dependencies the cached venv lacks (added since it was built) are installed into the run's venv
    minimal = _with_library(run_folder / "minimal", (dependencies, bare), wheel)
    return {
        "full": Path(sys.executable),
        "minimal": minimal,
        "bare": python_of(bare),
        "bare_torchao": python_of(torchao),
    }


#: What the no-torch deployment environment holds besides the library (installed without its dependencies).
ONNX_RUNTIME_PACKAGES = ("onnxruntime", "numpy", "tokenizers")


def build_onnx_runtime_env(run_folder: Path) -> Path:
    """The python of ``onnx_runtime``: onnxruntime, numpy and tokenizers (this interpreter's versions; cached, built
    where missing) and this checkout's library installed with ``--no-deps`` in ``run_folder``, and no torch, as where
    an exported model is deployed."""
    pins = [sys.version, *(requirement(name) for name in ONNX_RUNTIME_PACKAGES)]
    folder = cache_root() / hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12] / "onnx_runtime_packages"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / ".lock")):
        if not (folder / ".complete").exists():
            _venv(folder)
            _pip(folder, *(requirement(name) for name in ONNX_RUNTIME_PACKAGES))
            (folder / ".complete").touch()
    return _with_library(run_folder / "onnx_runtime", (folder,), library_wheel(run_folder), "--no-deps")
