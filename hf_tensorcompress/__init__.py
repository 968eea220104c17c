"""hf_tensorcompress: tensor compression for Hugging Face transformers, saved as checkpoints that load anywhere.

Public entry points: ``CompressionConfig`` + ``apply_compression`` (every method), ``compression_report``,
``push_to_hub``. Importing the package registers ``quant_method="tensorcompress"`` with transformers, so compressed
checkpoints load through any transformers class and ``from_pretrained(..., quantization_config=CompressionConfig(...))``
compresses while loading. Each method's own config, layer and helpers live in ``hf_tensorcompress.methods.<method>``,
the Smartformer rank search in ``hf_tensorcompress.search``.
"""

from .compress import apply_compression, refresh_compression_config
from .config import CompressionConfig
from .core.metrics import compression_report, nonzero_flops, storage_bits
from .core.quantizer import TensorCompressQuantizer, register_quantization
from .core.structure import CompressedCheckpointError
from .core.targets import UnsupportedModelError
from .hub import CardInfo, PushError, model_card, push_to_hub
from .methods.biprop import BipropConfig, BipropLinear
from .methods.biprop.apply import apply_attention
from .methods.cp import CPConfig, CPLinear
from .methods.svd import LowRankLinear, SVDConfig
from .methods.tt import TTConfig, TTEmbedding
from .methods.tt.apply import apply_tt
from .methods.tt.calibration import TTCalibration
from .search.optim import replace_parameters_in_optimizer

__all__ = [
    "CompressionConfig",
    "CPConfig",
    "SVDConfig",
    "BipropConfig",
    "TTConfig",
    "apply_compression",
    "apply_tt",
    "TTCalibration",
    "refresh_compression_config",
    "compression_report",
    "nonzero_flops",
    "storage_bits",
    "apply_attention",
    "BipropLinear",
    "CPLinear",
    "LowRankLinear",
    "TTEmbedding",
    "replace_parameters_in_optimizer",
    "CompressedCheckpointError",
    "TensorCompressQuantizer",
    "UnsupportedModelError",
    "CardInfo",
    "PushError",
    "model_card",
    "push_to_hub",
]
__version__ = "0.1.0"

register_quantization()
