"""hf_tensorcompress: tensor compression for Hugging Face transformers, saved as checkpoints that load anywhere.

Public entry points: ``CompressionConfig`` + ``apply_compression`` (every method), ``decompress``,
``compression_report``, ``push_to_hub``. Each method's own config, layer and helpers live in
``hf_tensorcompress.methods.<method>`` and are exported here too (each method package's ``_EXPORTS``); a new method
registers with ``register_method``. The Smartformer rank search is in ``hf_tensorcompress.search``.

Importing the package calls ``register_with_transformers()``, which registers ``quant_method="tensorcompress"`` with
transformers once transformers' model loading is imported, so compressed checkpoints load through any transformers
class and ``from_pretrained(..., quantization_config=CompressionConfig(...))`` compresses while loading. Names are
imported on first use (PEP 562), so ``import hf_tensorcompress`` and the command line's ``--help`` do not import the
model, data or evaluation code.
"""

from __future__ import annotations

import importlib
import pkgutil

from .core.lazy import lazy_exports
from .core.log_noise import silence_third_party_noise
from .core.registry import add_method_package
from .registration import register_with_transformers

silence_third_party_noise()  # before transformers imports torchao with its quantizers

#: public name -> module (relative to this package) that defines it; the methods' names are added below
_EXPORTS = {
    "CompressionConfig": ".config",
    "apply_compression": ".compress",
    "apply_calibrated": ".compress",
    "apply_tiered": ".compress",
    "apply_tt": ".compress",
    "refresh_compression_config": ".compress",
    "decompress": ".runtime.decompress",
    "compression_report": ".core.metrics",
    "nonzero_flops": ".core.metrics",
    "storage_bits": ".core.metrics",
    "CompressedLayer": ".runtime.contract",
    "CompressedLinear": ".runtime.contract",
    "LowBitTensor": ".runtime.lowbit",
    "TernaryTensor": ".runtime.ternary",
    "ModelOption": ".runtime.contract",
    "Method": ".core.registry",
    "register_method": ".core.registry",
    "CompressedCheckpointError": ".runtime.structure",
    "UnsupportedModelError": ".core.targets",
    "TensorCompressQuantizer": ".quantizer",
    "quantize_linears": ".stacking",
    "register_with_transformers": ".registration",
    "replace_parameters_in_optimizer": ".search.optim",
    "load_model": ".loading",
    "CardInfo": ".hub",
    "PushError": ".hub",
    "model_card": ".hub",
    "push_to_hub": ".hub",
    "export_onnx": ".deploy.onnx.export",
}
add_method_package(f"{__name__}.methods")
for _info in pkgutil.iter_modules(importlib.import_module(f"{__name__}.methods").__path__):
    _package = importlib.import_module(f"{__name__}.methods.{_info.name}")
    _EXPORTS.update({name: f".methods.{_info.name}{module}" for name, module in _package._EXPORTS.items()})

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


register_with_transformers()
