"""Benchmarks for ``make bench``: each ``bench_*.py`` module exposes ``run() -> list[Table]``."""
