"""Loads every calibration artifact under the artifacts folder and builds its heads and tails.

A model version whose artifact or weights are broken is kept as *not ready* with the reason;
the others serve. Weights load through safetensors only, and must hash to the artifact's
``weights_sha256``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import fx

from qpart.models.errors import ModelsError
from qpart.models.partition import Cut, cuts_of, prepare, split
from qpart.models.preprocess import PreprocessSpec
from qpart.models.registry import get_model
from qpart.profiles.artifacts import ARTIFACT_FILE, CalibrationArtifact, Pattern, load_artifact
from qpart.profiles.errors import ProfileError
from qpart.server.errors import NotFoundError, NotReadyError

log = logging.getLogger(__name__)
WEIGHTS_FILE = "weights.safetensors"


@dataclass
class LoadedModel:
    """A ready model version: its artifact, traced graph, heads and tails, and what its card
    declares (preprocessing, class names in logit order)."""

    artifact: CalibrationArtifact
    gm: fx.GraphModule
    cuts: list[Cut]
    parts: list[tuple[fx.GraphModule, fx.GraphModule]]
    patterns: dict[str, Pattern] = field(default_factory=dict)
    preprocess: PreprocessSpec | None = None
    labels: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """Model name."""
        return self.artifact.model

    @property
    def version(self) -> str:
        """Model version (a prefix of the weights' sha256)."""
        return self.artifact.version


@dataclass
class ModelEntry:
    """A model version found on disk: ready with its runtime, or not, with the reason."""

    name: str
    version: str
    source: Path
    model: LoadedModel | None = None
    reason: str | None = None

    @property
    def ready(self) -> bool:
        """True when the version can serve."""
        return self.model is not None


# An absolute path: a "/" that follows no word, dot, colon or slash (so no URL), then components.
_PATH = re.compile(r"(?<![\w.:/])(?:/[^/\s'\"]+)*/([^/\s'\"]+)")


def public_reason(exc: Exception) -> str:
    """``exc``'s message for anyone who asks readiness: every absolute path cut to its file name
    (the log has the whole message)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # one line, no input dump
    return _PATH.sub(r"\1", first)


def _load_one(folder: Path) -> ModelEntry:
    artifact = load_artifact(folder)
    entry = ModelEntry(artifact.model, artifact.version, folder)
    spec = get_model(artifact.model)
    weights = folder / WEIGHTS_FILE
    if weights.is_file():
        spec = replace(spec, weights=weights)
    digest = hashlib.sha256(spec.weights.read_bytes()).hexdigest()
    if digest != artifact.weights_sha256:
        # The reason is public (readiness answers anyone): the path goes to the log only.
        log.error("model %s: weights %s hash to %s, not the artifact's %s", artifact.model,
                  spec.weights, digest, artifact.weights_sha256)
        entry.reason = (f"its weights hash to {digest[:12]}, the artifact was calibrated "
                        f"for {artifact.weights_sha256[:12]}; re-run qpart calibrate")
        return entry
    gm = prepare(spec.load(), tuple(artifact.input_shape))
    cuts = cuts_of(gm)
    if [c.node for c in cuts] != [c.node for c in artifact.cuts]:
        entry.reason = "the model's legal cuts differ from the artifact's; re-run qpart calibrate"
        return entry
    try:
        preprocess, labels = spec.preprocess, spec.labels
    except ModelsError as exc:
        entry.reason = f"its model card is invalid: {public_reason(exc)}"
        return entry
    classes = math.prod(cuts[-1].shape)
    if labels is not None and len(labels) != classes:
        entry.reason = (f"its model card names {len(labels)} labels but the model gives {classes} logits; "
                        f"re-register it with one label per logit")
        return entry
    parts = [split(gm, c) for c in cuts]
    for head, tail in parts:
        head.eval()
        tail.eval()
        for p in [*head.parameters(), *tail.parameters()]:
            p.requires_grad_(False)
    entry.model = LoadedModel(artifact, gm, cuts, parts, {p.pattern_id: p for p in artifact.patterns},
                              preprocess, labels)
    return entry


class Catalog:
    """Every model version found under the artifacts folder."""

    def __init__(self, entries: list[ModelEntry]) -> None:
        self.entries = tuple(entries)
        self.known_names = frozenset(e.name for e in entries)  # read on every request's metrics

    @classmethod
    def load(cls, root: Path) -> Catalog:
        """Scan ``root`` (and its sub-folders) for ``artifact.json`` files and load each."""
        folders = sorted({p.parent for p in root.glob(f"**/{ARTIFACT_FILE}")}) if root.is_dir() else []
        entries = []
        with torch.no_grad():
            for folder in folders:
                try:
                    entries.append(_load_one(folder))
                except (ProfileError, ModelsError, OSError, ValueError, RuntimeError) as exc:
                    log.error("model artifact %s is not ready: %s", folder, exc)
                    entries.append(ModelEntry(folder.name, "unknown", folder, None, public_reason(exc)))
        return cls(entries)

    def names(self) -> list[str]:
        """Distinct model names, sorted."""
        return sorted({e.name for e in self.entries})

    def versions(self, name: str) -> list[ModelEntry]:
        """Entries of one model, newest artifact folder last."""
        found = [e for e in self.entries if e.name == name]
        if not found:
            raise NotFoundError(f"unknown model '{name}'",
                                listing=f"served models: {', '.join(self.names()) or 'none'}")
        return found

    def entry(self, name: str, version: str | None = None) -> ModelEntry:
        """One version (default: the last ready one, else the last one)."""
        found = self.versions(name)
        if version is None:
            ready = [e for e in found if e.ready]
            return ready[-1] if ready else found[-1]
        for e in found:
            if e.version == version:
                return e
        known = ", ".join(e.version for e in found)
        raise NotFoundError(f"model '{name}' has no version '{version}'", listing=f"versions: {known}")

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """A ready model, or NotFound / NotReady with the reason."""
        entry = self.entry(name, version)
        if entry.model is None:
            raise NotReadyError(f"model '{name}' version '{entry.version}' is not ready: {entry.reason}")
        return entry.model
