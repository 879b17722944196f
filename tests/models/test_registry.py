"""Registering your own model: factory + safetensors + input shape; failures leave no trace."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qpart.models.errors import ModelLoadError, PartitionError, UnknownModelError
from qpart.models.registry import get_model, list_models, register_model


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "mynets"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def tiny():
            return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))

        class Untraceable(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                    return self.fc(x)
                return -self.fc(x)

        def untraceable():
            return Untraceable()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("mynets")]:
        del sys.modules[name]


def test_a_registered_model_is_listed_and_loads(user_package, tmp_path, monkeypatch):
    from mynets import tiny

    weights = tmp_path / "tiny.safetensors"
    save_file(tiny().state_dict(), str(weights))
    registry = tmp_path / "models.json"
    monkeypatch.setenv("QPART_MODEL_REGISTRY", str(registry))
    register_model("my-tiny", "mynets:tiny", weights, (3, 8, 8), registry)
    assert "my-tiny" in [m.name for m in list_models()]
    model = get_model("my-tiny").load()
    assert model(torch.zeros(1, 3, 8, 8)).shape == (1, 5)


def test_an_untraceable_model_is_refused_and_the_registry_is_untouched(user_package, tmp_path):
    from mynets import untraceable

    weights = tmp_path / "u.safetensors"
    save_file(untraceable().state_dict(), str(weights))
    registry = tmp_path / "models.json"
    registry.write_text(json.dumps({"models": []}))
    with pytest.raises(PartitionError):
        register_model("bad", "mynets:untraceable", weights, (4,), registry)
    assert json.loads(registry.read_text()) == {"models": []}


def test_built_in_names_cannot_be_shadowed(user_package, tmp_path):
    with pytest.raises(ModelLoadError, match="built-in"):
        register_model("fmnist-cnn", "mynets:tiny", tmp_path / "x.safetensors", (3, 8, 8),
                       tmp_path / "models.json")


def test_bad_factory_paths_and_unknown_names_are_clear_errors():
    with pytest.raises(ModelLoadError, match=r"package\.module:function"):
        register_model("x", "not a path", Path("w"), (1,), Path("r.json"))
    with pytest.raises(UnknownModelError, match="registered: fmnist-cnn"):
        get_model("nope")
