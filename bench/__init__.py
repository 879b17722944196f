"""Benchmarks and baselines: they report numbers and never gate CI on time."""
