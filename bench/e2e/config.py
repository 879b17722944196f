"""bench.e2e's grid and fixed settings: devices, rates, models, presets, strategies, ports."""

from __future__ import annotations

DEVICES = ("raspberry-pi-4", "jetson-nano", "phone-soc")
RUNTIMES = {"jetson-nano": "onnx"}  # devices whose heads run in ONNX Runtime (ONNX segments); else torch
RATES_MBPS = (1.0, 5.0, 20.0, 100.0)
MODELS = ("fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet")
PRESET_NAMES = ("latency-first", "energy-first")
DEMAND = 0.01
EXTRA_LEVEL = 1.0  # level of the baselines' patterns: above every demand, never planned
STRATEGIES = ("qpart", "all-server", "all-device", "neurosurgeon", "uniform-int8", "qpart-paper")
QUICK_MODELS = ("fmnist-cnn", "fmnist-mobilenet")
QUICK_DEVICES = ("raspberry-pi-4", "jetson-nano")
QUICK_RATES_MBPS = (5.0,)
QUICK_PRESETS = ("latency-first",)
PORT = 18500
CLOCK = "reference"  # the reference workload's place in a round's order (not a pattern id)
FILLER_PORT = 18501  # bench.harness.shaped_server's orders (filler frames per response)
