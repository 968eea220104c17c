"""The exporter's refusal (its own module, so the graph builders raise it without importing the exporter)."""

from __future__ import annotations


class OnnxExportError(ValueError):
    """A model or option this exporter does not take to ONNX (the message says why and what does export)."""
