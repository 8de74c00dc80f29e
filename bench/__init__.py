"""Benchmarks: run with ``python -m bench.<name>``, not by the test suite.

Each benchmark measures the machine's own limits in the same run and reports its figures as
ratios to them (see :mod:`bench.machine`); results and the exact commands are recorded in
``docs/benchmarks.md``.
"""
