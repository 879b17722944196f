"""Head segments: built on demand from a pattern, content-addressed, cached under a byte budget.

The cache keeps whole, verified segments only. Eviction follows DAF's importance-keyed pages:
the entry with the lowest ``hits / bytes``, decayed by the time since its last use, goes first.
The budget can change at run time; shrinking it evicts at once. The small index from pattern to
(segment id, size) is kept outside the budget, so an evicted segment is rebuilt on demand and its
sha256 checked against the id before it is served: a partial or stale segment is never served.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import fx

from qpart.kernels import PackedTensor, QuantScheme, quantize_pack, weight_group_size
from qpart.kernels.segment_format import SegmentHeader, encode_segment
from qpart.models.onnx_export import head_to_onnx
from qpart.profiles.artifacts import FLOAT_BITS, Pattern


def quantize_head(head: fx.GraphModule, pattern: Pattern) -> tuple[dict[str, PackedTensor],
                                                                    dict[str, np.ndarray]]:
    """The head's tensors as a segment carries them: weights quantized and packed per ``pattern``,
    every other tensor float32."""
    quantized = {}
    floats: dict[str, np.ndarray] = {}
    for name, param in head.named_parameters():
        bits = pattern.weight_bits.get(name, FLOAT_BITS)
        arr = param.detach().numpy()
        if bits < FLOAT_BITS:
            quantized[name] = quantize_pack(arr, QuantScheme(bits, weight_group_size(arr.shape)))
        else:
            floats[name] = arr.astype(np.float32)
    for name, buf in head.named_buffers():
        floats[name] = buf.detach().numpy().astype(np.float32)
    return quantized, floats


def build_segment(head: fx.GraphModule, model: str, version: str, pattern: Pattern) -> bytes:
    """Quantize and pack the head's weights per ``pattern``; other tensors travel as float32."""
    quantized, floats = quantize_head(head, pattern)
    header = SegmentHeader(model, version, pattern.cut, pattern.pattern_id)
    return encode_segment(header, quantized, floats)


def build_onnx_segment(head: fx.GraphModule, input_shape: tuple[int, ...], model: str, version: str,
                       pattern: Pattern) -> bytes:
    """The ONNX form of the same segment (ADR 0012): the same packed codes, scales and mins,
    rebuilt in the graph, which ends in the activation at the cut."""
    quantized, floats = quantize_head(head, pattern)
    proto = head_to_onnx(head, input_shape, quantized, floats, {
        "model": model, "version": version, "cut": str(pattern.cut), "pattern_id": pattern.pattern_id})
    data: bytes = proto.SerializeToString(deterministic=True)
    return data


@dataclass
class _Entry:
    data: bytes
    hits: int
    last_used: float


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache counters."""

    resident_bytes: int
    budget_bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int


class SegmentStore:
    """Thread-safe, budgeted, importance-evicting cache of segment bytes keyed by sha256."""

    def __init__(self, budget_bytes: int, half_life_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._budget = budget_bytes
        self._half_life = half_life_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._resident = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def _importance(self, entry: _Entry, now: float) -> float:
        decay = 0.5 ** ((now - entry.last_used) / self._half_life)
        return float(entry.hits * decay / max(1, len(entry.data)))

    def _evict_until(self, room: int) -> None:
        now = self._clock()
        while self._entries and self._resident + room > self._budget:
            victim = min(self._entries, key=lambda k: self._importance(self._entries[k], now))
            self._resident -= len(self._entries.pop(victim).data)
            self.evictions += 1

    def get_or_build(self, segment_id: str, build: Callable[[], bytes]) -> bytes:
        """The segment's bytes, from the cache or built (and verified) now (see ``lookup``)."""
        return self.lookup(segment_id, build)[0]

    def lookup(self, segment_id: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
        """``(bytes, hit)``: from the cache (hit) or built and verified now (miss).

        Raises:
            RuntimeError: the rebuilt bytes do not hash to ``segment_id`` (stale artifact).
        """
        with self._lock:
            entry = self._entries.get(segment_id)
            if entry is not None:
                entry.hits += 1
                entry.last_used = self._clock()
                self.hits += 1
                return entry.data, True
            self.misses += 1
        data = build()
        if hashlib.sha256(data).hexdigest() != segment_id:
            raise RuntimeError(f"rebuilt segment does not match its id {segment_id}")
        self.put(segment_id, data)
        return data, False

    def put(self, segment_id: str, data: bytes) -> None:
        """Insert verified bytes if they can fit the budget (evicting less important entries)."""
        with self._lock:
            if segment_id in self._entries or len(data) > self._budget:
                return
            self._evict_until(len(data))
            self._entries[segment_id] = _Entry(data, 1, self._clock())
            self._resident += len(data)

    def set_budget(self, budget_bytes: int) -> None:
        """Change the byte budget; evicts at once when it shrinks."""
        with self._lock:
            self._budget = budget_bytes
            self._evict_until(0)

    def stats(self) -> CacheStats:
        """Counters and sizes now."""
        with self._lock:
            return CacheStats(self._resident, self._budget, len(self._entries), self.hits,
                              self.misses, self.evictions)
