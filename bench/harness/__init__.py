"""Shared infrastructure of the benchmarks: the shaped link and its probes, the server wrappers,
the load generator, the device clock, the idle spinners and the baselines' codecs and routes.

Nothing here imports a benchmark (:mod:`bench.micro`, :mod:`bench.e2e`); both tiers import it.
"""
