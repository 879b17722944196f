"""Registering your own model: factory + safetensors + input shape, and the card's preprocessing and
labels checked with one forward pass; failures leave no trace."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qpart.models.errors import (
    LabelsError,
    ModelLoadError,
    PartitionError,
    PreprocessError,
    UnknownModelError,
)
from qpart.models.preprocess import FASHION_MNIST_SPEC, PreprocessSpec
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


def test_a_model_that_is_not_found_says_where_own_models_come_from(monkeypatch, tmp_path):
    from qpart.models.registry import REGISTRY_ENV, import_factory

    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    with pytest.raises(UnknownModelError, match=f"{REGISTRY_ENV} is not set: set it to the registry file"):
        get_model("mine")
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "models.json"))
    with pytest.raises(UnknownModelError, match=r"your own models are read from .*models\.json"):
        get_model("mine")
    with pytest.raises(ModelLoadError, match=r"pip install -e DIR, or PYTHONPATH=DIR"):
        import_factory("no_such_package_here.nets:tiny")


FASHION_LABELS = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle boot")
RGB8 = PreprocessSpec(color="RGB", resize=(8, 8), mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2))


@pytest.mark.parametrize("name", ["fmnist-cnn", "fmnist-resnet"])
def test_the_reference_cards_declare_fashion_mnist_preprocessing_and_labels(name):
    spec = get_model(name)
    assert spec.preprocess == FASHION_MNIST_SPEC and spec.labels == FASHION_LABELS
    assert spec.load()(torch.zeros(1, 1, 28, 28)).shape == (1, len(FASHION_LABELS))


def test_preprocessing_and_labels_are_kept_in_the_registry(user_package, tmp_path, monkeypatch):
    from mynets import tiny

    weights = tmp_path / "tiny.safetensors"
    save_file(tiny().state_dict(), str(weights))
    registry = tmp_path / "models.json"
    monkeypatch.setenv("QPART_MODEL_REGISTRY", str(registry))
    register_model("my-tiny", "mynets:tiny", weights, (3, 8, 8), registry, preprocess=RGB8,
                   labels=["a", "b", "c", "d", "e"])
    spec = get_model("my-tiny")
    assert spec.preprocess == RGB8 and spec.labels == ("a", "b", "c", "d", "e")


@pytest.mark.parametrize(("preprocess", "labels", "error", "message"), [
    pytest.param(PreprocessSpec(color="L", resize=(8, 8), mean=(0.5,), std=(0.2,)), None, PreprocessError,
                 r"makes samples of shape \[1, 8, 8\] but 'x' takes \[3, 8, 8\]", id="shape"),
    pytest.param(None, ["a", "b"], LabelsError, r"logits of shape \[1, 5\] for one sample but 2 labels",
                 id="labels-count"),
    pytest.param(None, [], LabelsError, "list of 1", id="no-labels"),
    pytest.param(None, ["a", " ", "c", "d", "e"], LabelsError, "non-empty name", id="blank-label"),
])
def test_a_declaration_that_does_not_fit_is_refused_and_nothing_is_written(user_package, tmp_path, preprocess,
                                                                           labels, error, message):
    from mynets import tiny

    weights = tmp_path / "tiny.safetensors"
    save_file(tiny().state_dict(), str(weights))
    with pytest.raises(error, match=message):
        register_model("x", "mynets:tiny", weights, (3, 8, 8), tmp_path / "models.json",
                       preprocess=preprocess, labels=labels)
    assert not (tmp_path / "models.json").exists()


def test_a_model_that_rejects_the_preprocessed_sample_is_a_preprocess_error(user_package, tmp_path):
    from mynets import tiny

    weights = tmp_path / "tiny.safetensors"
    save_file(tiny().state_dict(), str(weights))
    ten = PreprocessSpec(color="RGB", resize=(10, 10), mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(PreprocessError, match=r"does not run on a preprocessed sample of shape \[3, 10"):
        register_model("x", "mynets:tiny", weights, (3, 10, 10), tmp_path / "models.json", preprocess=ten)


def test_a_malformed_card_preprocess_is_one_error_line():
    spec = get_model("fmnist-cnn")
    broken = type(spec)(spec.name, spec.factory, spec.input_shape, spec.weights,
                        {"preprocess": {"color": "CMYK", "mean": [0], "std": [1]}, "labels": "shirt"})
    with pytest.raises(PreprocessError, match="color"):
        _ = broken.preprocess
    with pytest.raises(LabelsError, match="labels must be a list"):
        _ = broken.labels


@pytest.mark.parametrize(("models", "said"), [
    ([{"name": "ok", "factory": "a.b:c", "input_shape": [1], "weights": "w"},
      {"name": "cam", "input_shape": [1, 28, 28], "weights": "w.safetensors"}],
     "entry 2 ('cam'), is malformed: it has no 'factory' field"),
    ([{"name": "cam", "factory": "a.b:c", "input_shape": "1x28x28", "weights": "w"}],
     "entry 1 ('cam'), is malformed: input_shape must be a list of sizes"),
    (["cam"], "entry 1, is malformed"),
])
def test_a_malformed_entry_is_named(tmp_path, models, said):
    from qpart.models.errors import RegistryError
    from qpart.models.registry import read_registry

    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"models": models}))
    with pytest.raises(RegistryError) as exc:
        read_registry(path)
    assert said in str(exc.value) and str(path) in str(exc.value)


@pytest.mark.parametrize("text", ["{", "[]", '{"models": {}}'])
def test_a_registry_that_is_not_an_object_with_a_models_list_says_so(tmp_path, text):
    from qpart.models.errors import RegistryError
    from qpart.models.registry import read_registry

    path = tmp_path / "registry.json"
    path.write_text(text)
    with pytest.raises(RegistryError, match=r"is not JSON|must be an object with a \"models\" list"):
        read_registry(path)
