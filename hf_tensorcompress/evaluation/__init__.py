"""Evaluation: forecasting metrics, perplexity, result tables and the shipped ``evaluate`` metric modules."""
