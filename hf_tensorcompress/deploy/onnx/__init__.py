"""ONNX export of compressed models (``export_onnx``) and a runner that needs only numpy and onnxruntime (``runner``).

Names are imported on first use, so ``hf_tensorcompress.deploy.onnx.runner`` imports in an environment without torch.
"""

from __future__ import annotations

from ...core.lazy import lazy_exports

_EXPORTS = {"export_onnx": ".export", "OnnxExportError": ".export"}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
