"""Test doubles shipped with the package for the suite and the benchmarks.

Only `tests/` and `bench/` import this package (tests/test_layers.py checks
it): production code talks to a real API server.
"""
