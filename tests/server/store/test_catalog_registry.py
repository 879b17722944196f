"""The server never serves a built-in model's artifact with a factory a registry file substitutes
(issue 52, finding 10): that model version is not ready, with the reason, and the factory is never
imported."""

from __future__ import annotations

import json
import sys

from qpart.models.registry import REGISTRY_ENV
from qpart.server.store.catalog import Catalog


def test_a_registry_that_shadows_a_built_in_model_keeps_its_artifact_out_of_service(cnn_only, tmp_path,
                                                                                      monkeypatch):
    marker = tmp_path / "imported.txt"
    (tmp_path / "shadow_nets.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                             "from qpart.models.architectures import fmnist_cnn as tiny\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = tmp_path / "models.json"
    # The artifact folder carries its own weights, so the weights would hash as the artifact says.
    registry.write_text(json.dumps({"models": [{
        "name": "fmnist-cnn", "factory": "shadow_nets:tiny", "input_shape": [1, 28, 28],
        "weights": str(cnn_only / "fmnist-cnn" / "weights.safetensors")}]}))
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    try:
        entry = Catalog.load(cnn_only).entry("fmnist-cnn")
    finally:
        sys.modules.pop("shadow_nets", None)
    assert not entry.ready
    assert entry.reason is not None and "names 'fmnist-cnn', a built-in reference model" in entry.reason
    assert not marker.exists()
