"""The segment index: which content id each pattern's head segment has, and the segments themselves
through the byte-budgeted :class:`server.store.segments.SegmentStore` (rebuilt and verified on a miss)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from qpart.kernels.onnx_segment import HeadRuntime
from qpart.models.errors import PartitionError
from qpart.profiles.artifacts import Pattern
from qpart.server.errors import NotFoundError, UnprocessableError
from qpart.server.store.catalog import Catalog, LoadedModel
from qpart.server.store.segments import SegmentStore, build_onnx_segment, build_segment


@dataclass(frozen=True)
class SegmentEntry:
    """Where a pattern's segment is: its content id (sha256) and size."""

    segment_id: str
    size: int
    model: str
    version: str
    pattern_id: str
    runtime: HeadRuntime = HeadRuntime.TORCH


def _build(model: LoadedModel, pattern: Pattern, runtime: HeadRuntime) -> bytes:
    """The pattern's segment in the form ``runtime`` reads."""
    head = model.parts[pattern.cut][0]
    if runtime is HeadRuntime.TORCH:
        return build_segment(head, model.name, model.version, pattern)
    try:
        return build_onnx_segment(head, tuple(model.artifact.input_shape), model.name, model.version, pattern)
    except PartitionError as exc:
        raise UnprocessableError(_refusal(model, pattern.cut, runtime, str(exc))) from exc


def _refusal(model: LoadedModel, cut: int, runtime: HeadRuntime, reason: str) -> str:
    return f"model '{model.name}' has no {runtime.value} head at cut {cut} ({reason})"


def refused_reason(model: LoadedModel, cut: int, runtime: HeadRuntime) -> str | None:
    """Why the calibration found that ``runtime`` cannot run the head at ``cut`` (None: it can, or
    the artifact predates the check)."""
    profiles = model.artifact.cuts
    return profiles[cut].runtimes_refused.get(runtime.value) if cut < len(profiles) else None


def runtime_table(model: LoadedModel) -> dict[str, dict[str, object]]:
    """Per device runtime, the cuts it runs and why not the others
    (:meth:`CalibrationArtifact.runtime_table`)."""
    return model.artifact.runtime_table()


class SegmentIndex:
    """Pattern -> segment entry, and segment id -> bytes. The index is small and kept whole; the
    bytes live in the store under its budget."""

    def __init__(self, catalog: Catalog, store: SegmentStore) -> None:
        self.catalog = catalog
        self.store = store
        self._by_pattern: dict[tuple[str, str, str, HeadRuntime], SegmentEntry | None] = {}
        self._by_segment: dict[str, SegmentEntry] = {}
        self._refused: dict[tuple[str, str, int, HeadRuntime], str] = {}

    def for_pattern(self, model: LoadedModel, pattern: Pattern,
                    runtime: HeadRuntime = HeadRuntime.TORCH) -> SegmentEntry | None:
        """The pattern's segment in ``runtime``'s form (None: its head has no tensors, as at
        cut 0), built once.

        Raises:
            UnprocessableError: ``runtime`` cannot run the head at the pattern's cut (as the
                calibration recorded, or as building it found), saying why.
        """
        key = (model.name, model.version, pattern.pattern_id, runtime)
        refused = (model.name, model.version, pattern.cut, runtime)
        if refused in self._refused:  # a head that failed to build is not tried on every plan
            raise UnprocessableError(self._refused[refused])
        if key not in self._by_pattern:
            head = model.parts[pattern.cut][0]
            reason = refused_reason(model, pattern.cut, runtime) if pattern.cut else None
            if reason is not None:
                self._refused[refused] = _refusal(model, pattern.cut, runtime, reason)
                raise UnprocessableError(self._refused[refused])
            if not list(head.parameters()) and not list(head.buffers()):
                self._by_pattern[key] = None
            else:
                try:
                    data = _build(model, pattern, runtime)
                except UnprocessableError as exc:
                    self._refused[refused] = str(exc)
                    raise
                digest = hashlib.sha256(data).hexdigest()
                entry = SegmentEntry(digest, len(data), model.name, model.version, pattern.pattern_id,
                                     runtime)
                self._by_pattern[key] = entry
                self._by_segment[digest] = entry
                self.store.put(digest, data)
        return self._by_pattern[key]

    def entry(self, segment_id: str) -> SegmentEntry:
        """Where a segment comes from and its size, without building or caching it."""
        entry = self._by_segment.get(segment_id)
        if entry is None:
            raise NotFoundError(f"no segment with id '{segment_id}'; ask for a plan to get a segment id")
        return entry

    def segment(self, segment_id: str) -> tuple[bytes, SegmentEntry, bool]:
        """A segment's bytes (from the cache, or rebuilt and verified), its entry, and whether the
        cache held it."""
        entry = self.entry(segment_id)
        model = self.catalog.get(entry.model, entry.version)
        pattern = model.patterns[entry.pattern_id]
        data, hit = self.store.lookup(segment_id, lambda: _build(model, pattern, entry.runtime))
        return data, entry, hit
