"""Benchmarks for subwabbit.

``python -m benchmarks`` runs the main suite (see :mod:`benchmarks.__main__`):
predictions within a 10 ms budget, throughput and training, side by side with
pyvw and the engine alone. The other modules run on their own as
``python -m benchmarks.<name>``.
"""
