"""The model registry: a name maps to an importable factory, a safetensors file and an input shape.

Built-in entries are the reference models whose trained weights live in ``models/zoo/``. More
entries come from a JSON registry file (``$QPART_MODEL_REGISTRY``), written by
``qpart models register``; nothing is ever unpickled: weights load through safetensors only.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from qpart.models.errors import ModelLoadError, UnknownModelError
from qpart.models.partition import legal_cuts

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
REGISTRY_ENV = "QPART_MODEL_REGISTRY"
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ModelSpec:
    """How to build one registered model."""

    name: str
    factory: str
    input_shape: tuple[int, ...]
    weights: Path
    card: dict[str, object] = field(default_factory=dict, compare=False)

    def build(self) -> nn.Module:
        """A fresh, randomly initialised instance of the architecture."""
        return import_factory(self.factory)()

    def load(self) -> nn.Module:
        """The architecture with its trained weights, in eval mode."""
        model = self.build()
        if not self.weights.is_file():
            raise ModelLoadError(
                f"weights for '{self.name}' not found at {self.weights}; "
                f"train them with: qpart train --model {self.name}"
            )
        try:
            state = load_file(str(self.weights))
            model.load_state_dict(state, strict=True)
        except (SafetensorError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"cannot load '{self.name}' from {self.weights}: {exc}") from exc
        return model.eval()


def import_factory(path: str) -> Callable[[], nn.Module]:
    """Resolve ``package.module:function`` to a callable returning an ``nn.Module``."""
    if not _FACTORY_RE.match(path):
        raise ModelLoadError(f"factory '{path}' is not of the form package.module:function")
    module_name, func_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import '{module_name}' for factory '{path}': {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ModelLoadError(f"'{func_name}' in '{module_name}' is not a callable factory")
    return func  # type: ignore[no-any-return]



def _card(name: str) -> dict[str, object]:
    path = ZOO_DIR / f"{name}.card.json"
    if path.is_file():
        loaded: dict[str, object] = json.loads(path.read_text())
        return loaded
    return {}


def _builtin() -> dict[str, ModelSpec]:
    entries = {
        "fmnist-cnn": "qpart.models.architectures:fmnist_cnn",
        "fmnist-resnet": "qpart.models.architectures:fmnist_resnet",
    }
    return {
        name: ModelSpec(name, factory, (1, 28, 28), ZOO_DIR / f"{name}.safetensors", _card(name))
        for name, factory in entries.items()
    }


def registry_path() -> Path | None:
    """The user registry file named by ``$QPART_MODEL_REGISTRY``, if any."""
    value = os.environ.get(REGISTRY_ENV)
    return Path(value) if value else None


def _user_entries() -> dict[str, ModelSpec]:
    path = registry_path()
    if path is None or not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {
            e["name"]: ModelSpec(
                e["name"], e["factory"], tuple(int(d) for d in e["input_shape"]),
                Path(e["weights"]), dict(e.get("card", {})),
            )
            for e in raw["models"]
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"model registry {path} is malformed: {exc}") from exc


def list_models() -> list[ModelSpec]:
    """Every registered model, built-in first."""
    merged = _builtin()
    merged.update(_user_entries())
    return list(merged.values())


def get_model(name: str) -> ModelSpec:
    """The spec of a registered model, or :class:`UnknownModelError` naming the known ones."""
    for spec in list_models():
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in list_models())
    raise UnknownModelError(f"unknown model '{name}'; registered: {known}")


def register_model(
    name: str, factory: str, weights: Path, input_shape: tuple[int, ...], path: Path
) -> ModelSpec:
    """Add (or replace) a user model in the registry file ``path``, checking it loads."""
    if not _NAME_RE.match(name):
        raise ModelLoadError(f"model name '{name}' must match {_NAME_RE.pattern}")
    if name in _builtin():
        raise ModelLoadError(f"'{name}' is a built-in reference model; choose another name")
    spec = ModelSpec(name, factory, input_shape, weights.resolve())
    model = spec.load()
    try:
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    except RuntimeError as exc:
        raise ModelLoadError(f"'{name}' does not run on inputs of shape {input_shape}: {exc}") from exc
    # Checked before the registry is written: a model the partitioner cannot cut is never listed.
    legal_cuts(model, input_shape)
    entries = json.loads(path.read_text())["models"] if path.is_file() else []
    entries = [e for e in entries if e["name"] != name]
    entries.append({"name": name, "factory": factory, "input_shape": list(input_shape),
                    "weights": str(spec.weights)})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"models": entries}, indent=2) + "\n")
    tmp.replace(path)
    return spec
