"""The Python environments the journey tier runs user flows in, built by the tests and cached between runs.

- ``full``: the test run's own interpreter (the library with every extra);
- ``minimal``: ``pip install .`` without extras (the library and its core dependencies, no torchao, gguf, …);
- ``bare``: torch + transformers + safetensors only, as where a checkpoint with remote code is deployed;
- ``bare_torchao``: bare plus torchao, for checkpoints whose Linear weights torchao quantized.

The versions of torch, transformers, safetensors and torchao are the ones this interpreter has, so outputs can be
compared across environments. ``minimal`` and ``bare_torchao`` are layered on ``bare`` (a ``.pth`` file puts bare's
site-packages on their path; pip sees those packages as installed), so torch is installed once. The environments
live in ``$HF_TENSORCOMPRESS_CACHE/journey-envs/<key>`` (default ``~/.cache/hf_tensorcompress``); the library in
``minimal`` is reinstalled from this checkout once per test session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
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


def _venv(folder: Path, layered_on: Path | None = None) -> None:
    """A fresh venv at ``folder``; with ``layered_on``, that venv's packages are importable from it too."""
    shutil.rmtree(folder, ignore_errors=True)
    _run(sys.executable, "-m", "venv", folder)
    if layered_on is not None:
        (site_packages(folder) / "_journey_base.pth").write_text(f"{site_packages(layered_on)}\n")


def _pip(folder: Path, *arguments: str | Path) -> None:
    _run(python_of(folder), "-m", "pip", "install", "-q", "--disable-pip-version-check", *arguments)


def _library_wheel(scratch: Path) -> Path:
    """A wheel of this checkout, built from a copy (no build files left in the repo)."""
    source = scratch / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "outputs", "site", "__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", source, "-w", scratch)
    return next(scratch.glob("hf_tensorcompress-*.whl"))


def build_environments() -> dict[str, Path]:
    """``{name: python executable}`` for full, minimal, bare and bare_torchao (built where missing; the library in
    minimal reinstalled from this checkout)."""
    root = cache_root() / env_key()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".lock")):
        bare, torchao, minimal = root / "bare", root / "bare_torchao", root / "minimal"
        if not (bare / ".complete").exists():
            _venv(bare)
            _pip(bare, *(requirement(name) for name in PINNED))
            (bare / ".complete").touch()
        if not (torchao / ".complete").exists():
            _venv(torchao, layered_on=bare)
            _pip(torchao, "--no-deps", requirement("torchao"))
            (torchao / ".complete").touch()
        with tempfile.TemporaryDirectory() as scratch:
            wheel = _library_wheel(Path(scratch))
            if not (minimal / ".complete").exists():
                _venv(minimal, layered_on=bare)
                _pip(minimal, wheel)
                (minimal / ".complete").touch()
            else:
                _pip(minimal, "--no-deps", "--force-reinstall", wheel)
    return {
        "full": Path(sys.executable),
        "minimal": python_of(minimal),
        "bare": python_of(bare),
        "bare_torchao": python_of(torchao),
    }


#: What the no-torch deployment environment holds besides the library (installed without its dependencies).
ONNX_RUNTIME_PACKAGES = ("onnxruntime", "numpy", "tokenizers")


def build_onnx_runtime_env() -> Path:
    """The python of ``onnx_runtime``: onnxruntime, numpy and tokenizers (this interpreter's versions) and the library
    installed with ``--no-deps``, and no torch, as where an exported model is deployed (built where missing; the
    library reinstalled from this checkout)."""
    pins = [sys.version, *(requirement(name) for name in ONNX_RUNTIME_PACKAGES)]
    folder = cache_root() / hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12] / "onnx_runtime"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / ".lock")):
        if not (folder / ".complete").exists():
            _venv(folder)
            _pip(folder, *(requirement(name) for name in ONNX_RUNTIME_PACKAGES))
            (folder / ".complete").touch()
        with tempfile.TemporaryDirectory() as scratch:
            _pip(folder, "--no-deps", "--force-reinstall", _library_wheel(Path(scratch)))
    return python_of(folder)
