"""Benchmarks: scripts run by path (``python benchmarks/bench_overhead.py``), each printing ratios against
the same loop without memexporter. A package so that the tests can import every one of them."""
