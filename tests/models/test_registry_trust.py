"""A registry file cannot shadow a built-in model, and reading it imports nothing (issue 52,
finding 10): a factory is imported when a model is built, never when it is listed or looked up."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import save_file
from torch import nn

from qpart.models.errors import ModelLoadError
from qpart.models.partition import legal_cuts
from qpart.models.registry import REGISTRY_ENV, get_model, list_models, register_model

TINY = "nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 26 * 26, 10))"


def tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 26 * 26, 10))


@pytest.fixture
def loud(tmp_path, monkeypatch):
    """An importable module ``loud_nets`` whose import writes ``imported.txt`` (the marker)."""
    (tmp_path / "loud_nets.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        from torch import nn

        Path({str(tmp_path / "imported.txt")!r}).write_text("imported")

        def tiny():
            return {TINY}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "imported.txt"
    sys.modules.pop("loud_nets", None)


def write_registry(path: Path, *entries: dict[str, object]) -> Path:
    path.write_text(json.dumps({"models": list(entries)}))
    return path


def entry(name: str, weights: Path, factory: str = "loud_nets:tiny") -> dict[str, object]:
    return {"name": name, "factory": factory, "input_shape": [1, 28, 28], "weights": str(weights)}


def test_a_registry_that_names_a_built_in_model_is_refused_not_merged(loud, tmp_path, monkeypatch):
    weights = tmp_path / "w.safetensors"
    save_file(tiny().state_dict(), str(weights))
    registry = write_registry(tmp_path / "models.json", entry("fmnist-cnn", weights))
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    with pytest.raises(ModelLoadError, match=r"names 'fmnist-cnn', a built-in reference model; a registry "
                                             r"cannot replace one"):
        get_model("fmnist-cnn")
    with pytest.raises(ModelLoadError, match="built-in"):
        list_models()
    assert not loud.exists()


@pytest.mark.parametrize(("entries", "message"), [
    pytest.param(["mine", "mine"], "lists 'mine' twice", id="twice"),
    pytest.param(["Mine Model"], "model name 'Mine Model' must match", id="bad-name"),
])
def test_a_registry_with_an_ambiguous_name_is_refused(tmp_path, monkeypatch, entries, message):
    registry = write_registry(tmp_path / "models.json", *(entry(n, tmp_path / "w") for n in entries))
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    with pytest.raises(ModelLoadError, match=message):
        get_model("mine")


def test_listing_and_looking_up_import_no_factory(loud, tmp_path, monkeypatch):
    weights = tmp_path / "w.safetensors"
    save_file(tiny().state_dict(), str(weights))
    monkeypatch.setenv(REGISTRY_ENV, str(write_registry(tmp_path / "models.json", entry("mine", weights))))
    assert "mine" in [s.name for s in list_models()]
    spec = get_model("mine")
    assert spec.labels is None and spec.preprocess is None  # the card is read, not the model
    assert not loud.exists() and "loud_nets" not in sys.modules
    spec.load()  # building it is what imports the factory
    assert loud.exists()


def test_relative_weights_are_read_from_the_registry_folder_not_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "reg").mkdir()
    (tmp_path / "elsewhere").mkdir()
    registry = write_registry(tmp_path / "reg" / "models.json",
                              {**entry("mine", Path("x")), "weights": "w.safetensors"})
    monkeypatch.setenv(REGISTRY_ENV, str(registry))
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert get_model("mine").weights == tmp_path / "reg" / "w.safetensors"


def test_register_records_the_counts_a_listing_shows_and_refuses_to_extend_a_shadowing_file(loud, tmp_path):
    weights = tmp_path / "w.safetensors"
    save_file(tiny().state_dict(), str(weights))
    registry = tmp_path / "models.json"
    spec = register_model("mine", "loud_nets:tiny", weights, (1, 28, 28), registry)
    (written,) = json.loads(registry.read_text())["models"]
    counts = {"params": sum(p.numel() for p in tiny().parameters()),
              "legal_cuts": len(legal_cuts(tiny(), (1, 28, 28)))}
    assert written["card"] == spec.card == counts
    shadowing = write_registry(tmp_path / "shadow.json", entry("fmnist-resnet", weights))
    before = shadowing.read_text()
    with pytest.raises(ModelLoadError, match="names 'fmnist-resnet', a built-in"):
        register_model("other", "loud_nets:tiny", weights, (1, 28, 28), shadowing)
    assert shadowing.read_text() == before
