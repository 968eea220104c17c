"""Deployment targets outside PyTorch: ``onnx`` exports compressed models to ONNX Runtime and runs them without torch."""
