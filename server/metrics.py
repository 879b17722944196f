"""Prometheus metrics of the server (one registry per app; names in base units, bounded labels).

Labels are limited to route, model, version, outcome, cut and level: never device or request ids.
A request for no served model (a name the server does not serve, or a route that names no model)
counts under ``model="unknown"``, the one spelling. The registry also carries the process, platform
and garbage-collector collectors (``process_*``, ``python_*``). Counters' and histograms'
``_created`` series are left out unless ``QPART_METRICS_CREATED`` is true: prometheus_client's own
switch (``disable_created_metrics``) is process-wide, so the filter sits on this registry instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qpart.server.store.segments import SegmentStore

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNKNOWN_MODEL = "unknown"  # the model label of a request for no served model
_BYTES = (256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)


@dataclass
class ConnectionCounts:
    """What the guard refused, for the metrics (one instance per server; api.connections fills it)."""

    over_cap: int = 0
    head_too_large: int = 0
    head_timeout: int = 0


class _CacheCollector(Collector):
    """Reads the segment cache's counters at scrape time."""

    def __init__(self, store: SegmentStore) -> None:
        self._store = store

    def collect(self):  # type: ignore[no-untyped-def]
        s = self._store.stats()
        yield GaugeMetricFamily("qpart_segment_cache_resident_bytes", "Bytes of cached segments.",
                                value=s.resident_bytes)
        yield GaugeMetricFamily("qpart_segment_cache_budget_bytes", "Byte budget of the cache.",
                                value=s.budget_bytes)
        yield GaugeMetricFamily("qpart_segment_cache_entries", "Cached segments.", value=s.entries)
        for name, value, doc in (("hits", s.hits, "Segment cache hits."),
                                 ("misses", s.misses, "Segment cache misses (built on demand)."),
                                 ("evictions", s.evictions, "Segments evicted from the cache.")):
            from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415 (local to collect)

            yield CounterMetricFamily(f"qpart_segment_cache_{name}", doc, value=value)


class _ConnectionCollector(Collector):
    """Reads what the connection guard refused at scrape time."""

    def __init__(self, counts: ConnectionCounts) -> None:
        self._counts = counts

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415 (local to collect)

        family = CounterMetricFamily(
            "qpart_connections_refused", "Connections closed by the protocol guard, by reason: over "
            "QPART_MAX_CONNECTIONS, head over QPART_MAX_HEADER_BYTES, head slower than "
            "QPART_HEADER_TIMEOUT_S.", labels=["reason"])
        c = self._counts
        for reason, value in (("over_cap", c.over_cap), ("head_too_large", c.head_too_large),
                              ("head_timeout", c.head_timeout)):
            family.add_metric([reason], value)
        yield family


class _Registry(CollectorRegistry):
    """A registry that drops ``_created`` samples unless asked to keep them (per registry, where
    prometheus_client's switch is global)."""

    def __init__(self, created: bool) -> None:
        super().__init__()
        self._created = created

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if self._created or not any(s.name.endswith("_created") for s in metric.samples):
                yield metric
                continue
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept


class Metrics:
    """All metric objects of one server instance."""

    def __init__(self, store: SegmentStore, version: str, *, created: bool = False) -> None:
        self.registry = _Registry(created)
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)  # registers nothing on interpreters without gc.get_stats
        self.requests = Counter("qpart_requests", "Requests by route, model and outcome.",
                                ["route", "model", "outcome"], registry=r)
        self.request_duration = Histogram("qpart_request_duration_seconds", "Request latency by route.",
                                          ["route"], buckets=_LATENCY, registry=r)
        self.plan_duration = Histogram("qpart_plan_duration_seconds", "Time to plan a request.",
                                       buckets=_LATENCY, registry=r)
        self.segment_stream = Histogram("qpart_segment_stream_duration_seconds",
                                        "Time to stream a segment response.", buckets=_LATENCY, registry=r)
        self.tail_queue = Histogram("qpart_tail_queue_duration_seconds", "Time tail requests waited.",
                                    ["model"], buckets=_LATENCY, registry=r)
        self.tail_compute = Histogram("qpart_tail_compute_duration_seconds", "Tail batch compute time.",
                                      ["model"], buckets=_LATENCY, registry=r)
        self.tail_batch = Histogram("qpart_tail_batch_size", "Samples per executed tail batch.",
                                    ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.bytes_sent = Counter("qpart_sent_bytes", "Response body bytes sent, by route.",
                                  ["route"], registry=r)
        self.bytes_received = Counter("qpart_received_bytes", "Request body bytes received, by route.",
                                      ["route"], registry=r)
        self.segment_bytes = Counter("qpart_segment_bytes", "Segment bytes streamed to devices.",
                                     ["model"], registry=r)
        self.plans = Counter("qpart_plans", "Chosen plans by model, cut and level.",
                             ["model", "cut", "level"], registry=r)
        self.plan_bytes = Histogram("qpart_plan_transfer_bytes", "Predicted bytes per planned request.",
                                    ["model"], buckets=_BYTES, registry=r)
        self.server_time_predicted = Counter(
            "qpart_tail_predicted_seconds", "Server tail seconds that plans price executed requests at "
            "(the start-up profile plus the live extra).", ["model"], registry=r)
        self.server_time_measured = Counter(
            "qpart_tail_measured_seconds", "Measured server tail seconds of executed requests.",
            ["model"], registry=r)
        self.tail_extra = Gauge(
            "qpart_tail_extra_seconds",
            "Seconds lone tail requests (batches of one that found the server idle 10 ms) took "
            "beyond the start-up profile, a moving average; plans price a cut at profile + this "
            "unless recent lone requests ran it (then by its own median).", ["model", "version"], registry=r)
        self.in_flight = Gauge("qpart_in_flight_requests", "Requests being processed.", registry=r)
        self.queue_depth = Gauge("qpart_tail_queue_depth", "Tail samples waiting, all models.", registry=r)
        self.queue_limit = Gauge("qpart_tail_queue_limit", "Tail samples that may wait per model "
                                 "before 503 (QPART_MAX_QUEUE); alerts compare the depth with it.",
                                 registry=r)
        self.shed = Counter("qpart_shed_requests", "Requests refused by overload protection.",
                            ["route"], registry=r)
        self.model_ready = Gauge("qpart_model_ready", "1 if the model version is ready to serve.",
                                 ["model", "version"], registry=r)
        self.build_info = Gauge("qpart_build_info", "Build information (value is 1).",
                                ["version"], registry=r)
        self.build_info.labels(version=version).set(1)
        r.register(_CacheCollector(store))
        self.connections = ConnectionCounts()  # filled by server.api.connections under `qpart serve`
        r.register(_ConnectionCollector(self.connections))
