"""transformers integration: ``quant_method="tensorcompress"``, registered when hf_tensorcompress is imported.

transformers rebuilds "weights stored in another form" through a quantizer (``transformers/quantizers``); this one
makes compressed models ordinary transformers models:

* a compressed checkpoint (its ``config.json`` carries ``quantization_config = QUANTIZATION_MARKER``) loads exactly
  through the base class and the Auto classes, no ``trust_remote_code``: before the weights load, the model (built
  on the meta device) gets its compressed structure from ``compression_config``; after, every compressed tensor must
  have come from the file;
* ``Model.from_pretrained(dense, quantization_config=CompressionConfig(...))`` compresses while loading: the dense
  weights load as usual, then ``apply_compression`` runs on them, so the result is the model
  ``apply_compression(Model.from_pretrained(dense), config)`` gives.

Either way the quantizer steps aside once loading is done (``hf_quantizer`` removed, ``is_quantized`` False): the
layers are ordinary trainable modules, and transformers restricts "quantized" models (``.half()``/``.float()``
refuse, the Trainer refuses them without adapters). Except where the checkpoint's other Linear weights are
torchao-quantized (``quantize_linears``; the marker nests torchao's config, ``runtime/torchao_linears.py``): then this
quantizer hands their loading to transformers' ``TorchAoHfQuantizer`` and stays attached, the model being quantized,
to save them the same way. Not shipped in checkpoints: where the library is not installed,
``trust_remote_code=True`` loads through the shipped ``Compressed<Base>`` instead.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from .config import CompressionConfig
from .core.registry import default_name, get_method, method_for
from .runtime.bnb_linears import BnbLinears
from .runtime.contract import QUANT_METHOD, quantization_marker
from .runtime.marker import marker_version_problem
from .runtime.torchao_linears import TorchAoLinears, keep_saveable, linear_quantizer


class CompressedCheckpointConfig(QuantizationConfigMixin):
    """What a checkpoint's ``quantization_config`` parses to: "the layers are described by ``compression_config``";
    ``linears``: the ``TorchAoConfig.to_dict()`` of the model's other Linear weights, where torchao quantized them."""

    def __init__(
        self, quant_method: str = QUANT_METHOD, version: int = 1, linears: dict | None = None, **_: Any
    ) -> None:
        problem = marker_version_problem(version)
        if problem is not None:
            from .runtime.structure import CompressedCheckpointError  # registration may run while structure imports

            raise CompressedCheckpointError(problem)
        self.quant_method = quant_method
        self.version = version
        self.linears = linears

    def to_dict(self) -> dict[str, Any]:
        """The marker as ``config.json`` holds it (``linears`` only where there are quantized Linears)."""
        return quantization_marker(self.linears)


def check_method(compression: dict) -> None:
    """A checkpoint's ``compression_config["method"]`` must be a registered method (an edited or foreign name
    would otherwise load unchecked and save back under a name no code knows); looking it up registers its layers."""
    from .runtime.structure import CompressedCheckpointError  # registration may run while structure imports

    method = compression.get("method", default_name())
    try:
        get_method(method)
    except ValueError as error:
        raise CompressedCheckpointError(
            f"config.json: compression_config['method'] = {method!r} is not a method of this hf_tensorcompress "
            f"({error}); restore config.json from the saved checkpoint, or upgrade hf_tensorcompress if a newer "
            "version wrote it"
        ) from None


class TensorCompressQuantizer(HfQuantizer):
    """Loads compressed checkpoints exactly, or compresses a dense checkpoint while it loads (module docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config: QuantizationConfigMixin, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        #: transformers' torchao (or bitsandbytes 4-bit) quantizer of the other Linear weights, where the checkpoint
        #: has quantized Linears (``runtime/torchao_linears.py``, ``runtime/bnb_linears.py``): this quantizer hands it
        #: their loading and saving.
        self.linears: TorchAoLinears | BnbLinears | None = None

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        """Compress-on-load: a ``CompressionConfig`` whose method needs no calibration data (a config field holding
        token ids would not serialise); checked before anything is built or read. A checkpoint with quantized
        Linears: torchao must be installed."""
        if self.pre_quantized:
            nested = getattr(self.quantization_config, "linears", None)
            if nested is not None:
                self.linears = linear_quantizer(nested, **kwargs)
            return
        config = self.quantization_config
        if not isinstance(config, CompressionConfig):
            raise TypeError(
                f"quant_method={QUANT_METHOD!r} compresses with a CompressionConfig, got {type(config).__name__}"
            )
        method = method_for(config)
        try:
            if method.prepare is not None:
                method.prepare(None, config, None)
        except ValueError as error:
            raise ValueError(
                f"{error}. A quantization_config cannot carry calibration data: load the dense model with "
                "from_pretrained, then compress it (for tt: apply_tt(model, config, calibration_ids))"
            ) from None

    def _process_model_before_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        from .runtime import modeling_tensorcompress as modeling  # not at import: registration may run mid-import
        from .runtime.checkpoint_files import local_folder
        from .runtime.checks import check_before_loading
        from .saving import save_extras

        if self.pre_quantized:
            check_method(modeling.compression_of(model.config))
            modeling.make_compressed(model, save_extras)
            check_before_loading(local_folder(model.config.name_or_path))  # before transformers' generic messages
            if self.linears is not None:
                self.linears._process_model_before_weight_loading(model, **kwargs)
            return model
        if modeling.is_compressed(model):
            raise ValueError(
                "this checkpoint is already compressed; load it without quantization_config (or compress the dense one)"
            )
        from .compress import check_model, resolve_targets

        check_model(model)
        resolve_targets(model, self.quantization_config)  # bad targets fail before any weight is read
        return model

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        from .runtime import modeling_tensorcompress as modeling  # not at import: registration may run mid-import
        from .runtime.checkpoint_files import local_folder
        from .runtime.checks import check_loaded
        from .runtime.structure import CompressedCheckpointError

        if self.pre_quantized:
            missing = modeling.unloaded_tensors(model)
            if missing:
                raise CompressedCheckpointError(  # worded as Compressed<Base>.from_pretrained words it
                    f"The checkpoint does not match its compression_config: missing_keys: {missing[:6]}. Save the "
                    "model again with save_pretrained, or fix compression_config in config.json."
                )
            check_loaded(model, local_folder(model.config.name_or_path))
        config = self.quantization_config
        if self.linears is not None:  # the Linears stay quantized: this quantizer stays, to save them
            model.config.quantization_config = config.to_dict()
            keep_saveable(model)
            return model
        self.remove_quantization_config(model)
        for module in model.modules():
            if hasattr(getattr(module, "config", None), "_is_quantized"):
                del module.config._is_quantized
        if not self.pre_quantized:
            from .compress import apply_compression

            apply_compression(model, config)
        model.config.quantization_config = quantization_marker()
        return model

    def _dequantize(self, model: nn.Module) -> nn.Module:
        """``model.dequantize()`` while this quantizer is attached: the dense model (``decompress``)."""
        from .runtime.decompress import decompress

        return decompress(model)

    def is_serializable(self, safe_serialization: bool | None = None) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        """Compressed layers are ordinary parameters (factors, scores, cores): they train (quantized Linears: as
        torchao says)."""
        return True if self.linears is None else self.linears.is_trainable

    @property
    def is_qat_trainable(self) -> bool:
        """Training the model itself, without adapters, is what the methods do (Smartformer, Biprop); not through
        torchao-quantized Linears."""
        return self.linears is None

    # The quantized Linears: what transformers asks a quantizer while loading and saving, answered by torchao's.
    def param_needs_quantization(self, model: nn.Module, param_name: str, **kwargs: Any) -> bool:
        return self.linears is not None and self.linears.param_needs_quantization(model, param_name, **kwargs)

    @property
    def quantized_element_size(self) -> float | None:
        return None if self.linears is None else self.linears.quantized_element_size

    @property
    def serialized_names(self) -> dict[str, list[str]]:
        return {} if self.linears is None else self.linears.serialized_names

    def get_load_operations(self) -> dict:
        return {} if self.linears is None else self.linears.get_load_operations()

    def get_weight_conversions(self) -> list:
        return [] if self.linears is None else self.linears.get_weight_conversions()

    def update_weight_conversions(self, weight_conversions: list, *model: nn.Module) -> list:
        """transformers 5.17 passes the conversions alone, 5.25 the model too: pass on what came."""
        if self.linears is None:
            return super().update_weight_conversions(weight_conversions, *model)
        return self.linears.update_weight_conversions(weight_conversions, *model)

    def get_state_dict_and_metadata(self, model: nn.Module) -> tuple[dict | None, dict]:
        if self.linears is None:
            return super().get_state_dict_and_metadata(model)
        return self.linears.get_state_dict_and_metadata(model)


def register_quantization() -> None:
    """Make ``quant_method="tensorcompress"`` known to transformers; idempotent (transformers' ``register_*``
    refuse a name twice, e.g. after a reload, so an earlier entry of ours is replaced)."""
    AUTO_QUANTIZATION_CONFIG_MAPPING.pop(QUANT_METHOD, None)
    AUTO_QUANTIZER_MAPPING.pop(QUANT_METHOD, None)
    register_quantization_config(QUANT_METHOD)(CompressedCheckpointConfig)
    register_quantizer(QUANT_METHOD)(TensorCompressQuantizer)
