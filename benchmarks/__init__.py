"""Benchmarks for subwabbit (run as ``python -m benchmarks.<name>``)."""
