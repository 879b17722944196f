"""The model registry: a name maps to an importable factory, a safetensors file, an input shape
and a card that declares, once, the model's preprocessing and label names.

Built-in entries are the reference models whose trained weights live in ``models/zoo/``. More
entries come from a JSON registry file (``$QPART_MODEL_REGISTRY``), written by
``qpart models register``; a registry file that names a built-in model is refused, never merged
over it. Listing reads files only: a factory is imported when a model is built. Nothing is ever
unpickled: weights load through safetensors only.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from qpart.models.errors import (
    LabelsError,
    ModelLoadError,
    PreprocessError,
    RegistryError,
    UnknownModelError,
)
from qpart.models.partition import legal_cuts
from qpart.models.preprocess import PreprocessSpec, preprocess_image

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
REGISTRY_ENV = "QPART_MODEL_REGISTRY"
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MAX_LABELS = 100_000
MAX_LABEL_CHARS = 200
# name -> (factory, input shape): the reference models, whose names no registry file may take.
_BUILTIN: dict[str, tuple[str, tuple[int, ...]]] = {
    "fmnist-cnn": ("qpart.models.architectures:fmnist_cnn", (1, 28, 28)),
    "fmnist-resnet": ("qpart.models.architectures:fmnist_resnet", (1, 28, 28)),
    "fmnist-mobilenet": ("qpart.models.mobilenet:fmnist_mobilenet", (3, 64, 64)),
}


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

    @property
    def preprocess(self) -> PreprocessSpec | None:
        """The card's preprocessing spec (None: the card declares none).

        Raises:
            PreprocessError: the card's ``preprocess`` is not a valid spec.
        """
        raw = self.card.get("preprocess")
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise PreprocessError(f"the card of '{self.name}' has a preprocess that is not a JSON object")
        return PreprocessSpec.from_mapping(raw)

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The card's class names in logit order (None: the card declares none).

        Raises:
            LabelsError: the card's ``labels`` is not a list of names.
        """
        raw = self.card.get("labels")
        return None if raw is None else check_labels(raw, f"the card of '{self.name}'")


def check_labels(raw: object, where: str) -> tuple[str, ...]:
    """``raw`` as a tuple of class names if it is a non-empty list of distinct, non-empty strings."""
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw or len(raw) > MAX_LABELS:
        raise LabelsError(f"{where}: labels must be a list of 1..{MAX_LABELS} class names")
    names = tuple(raw)
    if not all(isinstance(n, str) and 0 < len(n.strip()) <= MAX_LABEL_CHARS for n in names):
        raise LabelsError(f"{where}: every label must be a non-empty name of at most {MAX_LABEL_CHARS} "
                          f"characters")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise LabelsError(f"{where}: labels {twice[:5]} appear more than once; give each class one name")
    return names


def import_factory(path: str) -> Callable[[], nn.Module]:
    """Resolve ``package.module:function`` to a callable returning an ``nn.Module``."""
    if not _FACTORY_RE.match(path):
        raise ModelLoadError(f"factory '{path}' is not of the form package.module:function")
    module_name, func_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(
            f"cannot import '{module_name}' for factory '{path}': {exc}; make the package that holds "
            f"it importable here (pip install -e DIR, or PYTHONPATH=DIR: qpart does not import from "
            f"the working directory)") from exc
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


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in reference model's (no registry file may take it)."""
    return name in _BUILTIN


def _builtin() -> dict[str, ModelSpec]:
    return {
        name: ModelSpec(name, factory, shape, ZOO_DIR / f"{name}.safetensors", _card(name))
        for name, (factory, shape) in _BUILTIN.items()
    }


def registry_path() -> Path | None:
    """The user registry file named by ``$QPART_MODEL_REGISTRY``, if any."""
    value = os.environ.get(REGISTRY_ENV)
    return Path(value) if value else None


def _entry_spec(entry: Mapping[str, object], folder: Path) -> ModelSpec:
    """One registry entry as a spec; a relative weights path is read from the registry's ``folder``
    (never from the working directory)."""
    name, factory, shape = entry["name"], entry["factory"], entry["input_shape"]
    card = entry.get("card", {})
    if not isinstance(name, str) or not isinstance(factory, str) or not isinstance(card, Mapping):
        raise TypeError("name and factory must be strings, card an object")
    if not isinstance(shape, list):
        raise TypeError("input_shape must be a list of sizes")
    weights = Path(str(entry["weights"]))
    return ModelSpec(name, factory, tuple(int(d) for d in shape),
                     weights if weights.is_absolute() else folder / weights, dict(card))


def read_registry(path: Path) -> dict[str, ModelSpec]:
    """The models the registry file ``path`` lists, by name; nothing is imported.

    Raises:
        RegistryError: the file is malformed, lists a name twice, gives a name ``qpart models
            register`` would refuse, or names a built-in model (a registry cannot replace one).
    """
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise RegistryError(f"model registry {path} is not JSON: {exc}") from exc
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, list):
        raise RegistryError(f'model registry {path} is malformed: it must be an object with a "models" list')
    specs = []
    for number, entry in enumerate(models, 1):
        try:
            specs.append(_entry_spec(entry, path.parent))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            label = entry.get("name") if isinstance(entry, Mapping) else None
            which = f"entry {number}" + (f" ({label!r})" if isinstance(label, str) else "")
            detail = f"it has no {exc} field" if isinstance(exc, KeyError) else str(exc)
            raise RegistryError(f"model registry {path}, {which}, is malformed: {detail}") from exc
    entries: dict[str, ModelSpec] = {}
    for spec in specs:
        if is_builtin(spec.name):
            raise RegistryError(
                f"model registry {path} names '{spec.name}', a built-in reference model; a registry "
                f"cannot replace one: rename that entry (qpart models register --name NEW) or remove it")
        if not _NAME_RE.match(spec.name):
            raise RegistryError(f"model registry {path}: model name {spec.name!r} must match "
                                f"{_NAME_RE.pattern}")
        if spec.name in entries:
            raise RegistryError(f"model registry {path} lists '{spec.name}' twice; keep one entry")
        entries[spec.name] = spec
    return entries


def _user_entries() -> dict[str, ModelSpec]:
    path = registry_path()
    return read_registry(path) if path is not None and path.is_file() else {}


def list_models() -> list[ModelSpec]:
    """Every registered model, built-in first. Only files are read: no factory is imported (a
    spec's :meth:`ModelSpec.build` and :meth:`ModelSpec.load` import it).

    Raises:
        RegistryError: the registry file is malformed or names a built-in model.
    """
    return [*_builtin().values(), *_user_entries().values()]


def get_model(name: str) -> ModelSpec:
    """The spec of a registered model, or :class:`UnknownModelError` naming the known ones.

    Raises:
        UnknownModelError: no model of that name.
        RegistryError: the registry file is malformed or names a built-in model; refused even for
            a built-in name, so that a shadowing file is never used silently.
    """
    models = list_models()
    for spec in models:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in models)
    path = registry_path()
    where = (f"{REGISTRY_ENV} is not set: set it to the registry file qpart models register wrote"
             if path is None else f"your own models are read from {path} ({REGISTRY_ENV})")
    raise UnknownModelError(f"unknown model '{name}'; registered: {known} ({where})")


def declaration_sample(spec: PreprocessSpec, input_shape: tuple[int, ...]) -> np.ndarray:
    """A deterministic RGB noise image, at least as large as the input and the crop, preprocessed
    by ``spec``: float32 ``[C, H, W]``."""
    height, width = (input_shape[-2], input_shape[-1]) if len(input_shape) >= 2 else (1, 1)
    if spec.center_crop is not None:
        height, width = max(height, spec.center_crop[0]), max(width, spec.center_crop[1])
    noise = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return preprocess_image(Image.fromarray(noise, "RGB"), spec)


def check_declaration(model: nn.Module, name: str, input_shape: tuple[int, ...],
                      preprocess: PreprocessSpec | None, labels: Sequence[str] | None) -> None:
    """One forward pass on a preprocessed sample (zeros without a spec): the spec must make the
    input shape, the model must take it, and give one logit per label.

    Raises:
        PreprocessError: the spec's samples are not ``input_shape``, or the model rejects them.
        ModelLoadError: the model does not run on zeros of ``input_shape`` (no spec given).
        LabelsError: the model's logits are not one per label.
    """
    if preprocess is not None:
        sample = declaration_sample(preprocess, input_shape)
        if tuple(sample.shape) != input_shape:
            raise PreprocessError(
                f"the preprocessing makes samples of shape {list(sample.shape)} but '{name}' takes "
                f"{list(input_shape)}; change the color, resize or crop, or the input shape")
        x = torch.from_numpy(sample)[None]
    else:
        x = torch.zeros((1, *input_shape))
    try:
        with torch.no_grad():
            out = model(x)
    except RuntimeError as exc:
        what = "a preprocessed sample" if preprocess is not None else "inputs"
        error = PreprocessError if preprocess is not None else ModelLoadError
        raise error(f"'{name}' does not run on {what} of shape {list(x.shape[1:])}: "
                    f"{' '.join(str(exc).split())[:300]}") from exc
    if labels is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, len(labels))):
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise LabelsError(f"'{name}' gives logits of shape {shape} for one sample but {len(labels)} labels "
                          f"are declared; give one label per logit")


def register_model(
    name: str, factory: str, weights: Path, input_shape: tuple[int, ...], path: Path, *,
    preprocess: PreprocessSpec | None = None, labels: Sequence[str] | None = None,
) -> ModelSpec:
    """Add (or replace) a user model in the registry file ``path``, checking it loads, takes the
    preprocessed sample, gives one logit per label and traces; nothing is written on a failure.
    The card records the model's parameter and legal-cut counts, so that listing never imports it.

    Raises:
        RegistryError: ``path`` exists and is malformed or names a built-in model.
    """
    if not _NAME_RE.match(name):
        raise ModelLoadError(f"model name '{name}' must match {_NAME_RE.pattern}")
    if is_builtin(name):
        raise ModelLoadError(f"'{name}' is a built-in reference model; choose another name")
    if path.is_file():
        read_registry(path)  # a registry that shadows a built-in is not extended either
    names = None if labels is None else check_labels(list(labels), f"labels of '{name}'")
    card: dict[str, object] = {}
    if preprocess is not None:
        card["preprocess"] = preprocess.model_dump(mode="json")
    if names is not None:
        card["labels"] = list(names)
    spec = ModelSpec(name, factory, input_shape, weights.resolve(), card)
    model = spec.load()
    check_declaration(model, name, input_shape, preprocess, names)
    # Checked before the registry is written: a model the partitioner cannot cut is never listed.
    cuts = legal_cuts(model, input_shape)
    card.update(params=sum(int(p.numel()) for p in model.parameters()), legal_cuts=len(cuts))
    spec = replace(spec, card=card)
    entries = json.loads(path.read_text())["models"] if path.is_file() else []
    entries = [e for e in entries if e["name"] != name]
    entries.append({"name": name, "factory": factory, "input_shape": list(input_shape),
                    "weights": str(spec.weights), "card": card})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"models": entries}, indent=2) + "\n")
    tmp.replace(path)
    return spec
