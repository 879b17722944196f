"""Documents as the server writes them, for client tests that answer in its place."""

from __future__ import annotations

from typing import Any

COSTS = {"time_s": {"local": 0.0, "transfer": 0.005, "server": 0.002, "total": 0.007},
         "energy_j": {"local": 0.0, "transfer": 0.004, "total": 0.004}, "server_cost": 0.002,
         "objective": 0.0074, "transfer_bytes": 1808, "upload_encoding": "identity"}

PLAN: dict[str, Any] = {
    "plan_id": "fmnist-cnn@v1/c0-5951739120a72ce5", "model": "fmnist-cnn", "version": "v1", "cut": 0,
    "cut_node": "input_1", "cuts": 9, "level": 0.01, "weight_bits": {}, "activation_bits": 4,
    "group_size": 196, "activation_shape": [1, 28, 28], "predicted": COSTS, "all_server": COSTS,
    "all_device": COSTS, "segment": None,
    "infer_url": "/v1/models/fmnist-cnn/versions/v1/patterns/c0-5951739120a72ce5/infer",
    "upload_batch": 256, "upload_encoding": "identity"}
"""An all-server plan of fmnist-cnn (no segment), every field the server sends."""

ANSWER: dict[str, Any] = {
    "plan_id": PLAN["plan_id"], "model": "fmnist-cnn", "version": "v1", "queue_s": 0.001,
    "compute_s": 0.002, "results": [{"logits": [0.5, 2.0, -1.0],
                                     "top_k": [{"label": 1, "probability": 0.8}]}]}
"""The tail's answer to one sample of :data:`PLAN`."""
