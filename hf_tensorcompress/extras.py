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
    """An optional dependency is not installed; the message says which extra installs it."""


def require(package: str, purpose: str) -> ModuleType:
    """Import ``package`` (a module path such as ``aeon.datasets`` works too), or raise ``MissingExtraError``
    saying what it is needed for and which ``pip install "hf_tensorcompress[<extra>]"`` provides it."""
    top = package.split(".")[0]
    try:
        return importlib.import_module(package)
    except ImportError as error:
        if error.name is not None and error.name.split(".")[0] != top:
            raise  # the package is there but something inside it is broken: show the real error
        extra = EXTRAS.get(top, "all")
        raise MissingExtraError(
            f"{purpose} needs the optional package {top!r}, which is not installed; "
            f'install it with: pip install "hf_tensorcompress[{extra}]" (or [all])'
        ) from error
