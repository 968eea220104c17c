"""Optional dependencies, imported only where a feature needs them, with an error that names the extra to install.

| extra | package | needed for |
|---|---|---|
| ``lm`` | gguf | loading GGUF files (SmolLM2 ships as one) |
| ``sbt`` | aeon | the Sparse Binary Transformers recipe's data (UEA JapaneseVowels, KDD-TSAD) |
| ``plots`` | matplotlib | the Smartformer search plot, the TT recipe's figure |
| ``peft`` | peft | using PEFT adapters on compressed models |
| ``quant`` | torchao, bitsandbytes | the embedding's quantization arms; torchao- or bitsandbytes-quantized blocks beside a compressed embedding; the time-series recipes' PTQ and ternary QAT baselines (``hf_tensorcompress.baselines``) |
| ``onnx`` | onnx, onnxscript, onnxruntime | ``export-onnx`` / ``export_onnx`` and running the exported file (``deploy/onnx``) |
| ``all`` | all of the above | |
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: package -> the extra that installs it
EXTRAS = {
    "gguf": "lm",
    "aeon": "sbt",
    "matplotlib": "plots",
    "peft": "peft",
    "torchao": "quant",
    "bitsandbytes": "quant",
    "onnx": "onnx",
    "onnxscript": "onnx",
    "onnxruntime": "onnx",
}


class MissingExtraError(ImportError):
    """Optional dependencies are not installed; the message names every one of them and what installs them."""


def missing_message(packages: list[str], purpose: str) -> str:
    """What to say when ``packages`` (top-level names) are missing for ``purpose``: all of them in one line, with
    the pip command that installs them and the extra of this repository that does."""
    extras = sorted({EXTRAS.get(package, "all") for package in packages})
    names = ", ".join(repr(package) for package in packages)
    return (
        f"{purpose} needs the optional package{'s' if len(packages) > 1 else ''} {names}, not installed here; "
        f"install {'them' if len(packages) > 1 else 'it'} with: pip install {' '.join(packages)} (in a clone of "
        f'hf_tensorcompress: pip install -e ".[{",".join(extras)}]", or [all])'
    )


def check_installed(packages: tuple[str, ...] | list[str], purpose: str) -> None:
    """``MissingExtraError`` naming every one of ``packages`` that is not installed (found without importing any:
    the command line checks its flags before torch loads)."""
    missing = [package for package in packages if importlib.util.find_spec(package.split(".")[0]) is None]
    if missing:
        raise MissingExtraError(missing_message(missing, purpose))


def require(package: str, purpose: str) -> ModuleType:
    """Import ``package`` (a module path such as ``aeon.datasets`` works too), or raise ``MissingExtraError``
    saying what it is needed for and what installs it."""
    top = package.split(".")[0]
    try:
        return importlib.import_module(package)
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] != top:
            raise  # the package is there but something inside it is broken: show the real error
        raise MissingExtraError(missing_message([top], purpose)) from error


def require_all(packages: tuple[str, ...] | list[str], purpose: str) -> list[ModuleType]:
    """``require`` for several packages, every missing one named in one error (not the first, then the next)."""
    check_installed(packages, purpose)
    return [require(package, purpose) for package in packages]
