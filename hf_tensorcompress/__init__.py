"""hf_tensorcompress: tensor compression for Hugging Face transformers, saved as checkpoints that load anywhere.

Public entry points: ``CompressionConfig`` + ``apply_compression`` (every method), ``compression_report``,
``push_to_hub``. Each method's own config, layer and helpers live in ``hf_tensorcompress.methods.<method>``; the
Smartformer rank search in ``hf_tensorcompress.search``.

Importing the package registers ``quant_method="tensorcompress"`` with transformers (once transformers' quantizer
registry is imported), so compressed checkpoints load through any transformers class and
``from_pretrained(..., quantization_config=CompressionConfig(...))`` compresses while loading. Names are imported
on first use (PEP 562), so ``import hf_tensorcompress`` and the command line's ``--help`` do not import the model,
data or evaluation code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.registration import register_with_transformers
from .lazy import lazy_exports

#: public name -> module (relative to this package) that defines it
_EXPORTS = {
    "CompressionConfig": ".config",
    "CPConfig": ".methods.cp.config",
    "SVDConfig": ".methods.svd.config",
    "BipropConfig": ".methods.biprop.config",
    "TTConfig": ".methods.tt.config",
    "TieredConfig": ".methods.tiered.config",
    "apply_compression": ".compress",
    "refresh_compression_config": ".compress",
    "apply_tt": ".methods.tt.apply",
    "TTCalibration": ".methods.tt.calibration",
    "apply_tiered": ".methods.tiered.apply",
    "compression_report": ".core.metrics",
    "nonzero_flops": ".core.metrics",
    "storage_bits": ".core.metrics",
    "apply_attention": ".methods.biprop.apply",
    "BipropLinear": ".methods.biprop.layer",
    "CPLinear": ".methods.cp.layer",
    "LowRankLinear": ".methods.svd.layer",
    "TTEmbedding": ".methods.tt.layer",
    "TieredEmbedding": ".methods.tiered.layer",
    "LowBitTensor": ".core.lowbit",
    "replace_parameters_in_optimizer": ".search.optim",
    "CompressedCheckpointError": ".core.structure",
    "TensorCompressQuantizer": ".core.quantizer",
    "UnsupportedModelError": ".core.targets",
    "CardInfo": ".hub",
    "PushError": ".hub",
    "model_card": ".hub",
    "push_to_hub": ".hub",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static type checkers and IDEs see the eager imports
    from .compress import apply_compression, refresh_compression_config
    from .config import CompressionConfig
    from .core.metrics import compression_report, nonzero_flops, storage_bits
    from .core.quantizer import TensorCompressQuantizer
    from .core.structure import CompressedCheckpointError
    from .core.targets import UnsupportedModelError
    from .hub import CardInfo, PushError, model_card, push_to_hub
    from .methods.biprop.apply import apply_attention
    from .methods.biprop.config import BipropConfig
    from .methods.biprop.layer import BipropLinear
    from .methods.cp.config import CPConfig
    from .methods.cp.layer import CPLinear
    from .methods.svd.config import SVDConfig
    from .methods.svd.layer import LowRankLinear
    from .methods.tt.apply import apply_tt
    from .methods.tt.calibration import TTCalibration
    from .methods.tt.config import TTConfig
    from .methods.tt.layer import TTEmbedding
    from .core.lowbit import LowBitTensor
    from .methods.tiered.apply import apply_tiered
    from .methods.tiered.config import TieredConfig
    from .methods.tiered.layer import TieredEmbedding
    from .search.optim import replace_parameters_in_optimizer

register_with_transformers()
