"""hf_tensorcompress: tensor compression for Hugging Face transformers, saved as checkpoints that load anywhere."""

from .compress import apply_compression, refresh_compression_config
from .config import CompressionConfig
from .hub import CardInfo, PushError, model_card, push_to_hub
from .layers.biprop import BipropLinear
from .layers.cp import CPLinear
from .layers.lowrank import LowRankLinear
from .layers.structure import CompressedCheckpointError
from .methods.biprop import apply_attention
from .metrics import compression_report, nonzero_flops, storage_bits
from .optim import replace_parameters_in_optimizer
from .targets import UnsupportedModelError

__all__ = [
    "CompressionConfig",
    "apply_compression",
    "refresh_compression_config",
    "compression_report",
    "nonzero_flops",
    "storage_bits",
    "apply_attention",
    "BipropLinear",
    "replace_parameters_in_optimizer",
    "CPLinear",
    "LowRankLinear",
    "CompressedCheckpointError",
    "UnsupportedModelError",
    "CardInfo",
    "PushError",
    "model_card",
    "push_to_hub",
]
__version__ = "0.1.0"
