"""Baselines a user would pick instead of compressing: weight-only quantization and low-bit training."""
