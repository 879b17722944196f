"""Micro-benchmarks: one part of the product at a time (kernels, serving, compute, answers, the
KServe peer, load, hostile clients, the loader, calibration, codecs, ONNX and browser heads).

Each is ``python -m bench.micro.NAME``; they import :mod:`bench.harness`, never :mod:`bench.e2e`.
"""
