"""The live audit as the engine uses it: issue with a plan, record the answer, take the input
upload, and the Prometheus series (ADR 0024)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qpart.kernels.errors import KernelError
from qpart.kernels.wire import FLOAT_BITS, decode_activation_array, float_packet_bytes
from qpart.models.metrics import Top1Agreement
from qpart.profiles.artifacts import Pattern
from qpart.server.audit.book import AuditBook, Ticket
from qpart.server.audit.live import LiveDisagreement, reference_bound
from qpart.server.audit.worker import AuditJob, AuditWorker, KeptInputs, TopOne
from qpart.server.errors import BadRequestError, PayloadTooLargeError
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import LoadedModel


class Audits:
    """Open audits, the worker that checks them and the live rates they add up to."""

    def __init__(self, settings: ServerSettings, idle_s: Callable[[], float] | None = None,
                 went_idle: threading.Event | None = None) -> None:
        self.settings = settings
        self.book = AuditBook(settings.audit_rate, settings.audit_ttl_s, settings.audit_open_max)
        self.live = LiveDisagreement(settings.audit_delta, settings.audit_window)
        keep = (None if settings.audit_keep_dir is None
                else KeptInputs(settings.audit_keep_dir, settings.audit_keep_bytes))
        self.worker = AuditWorker(self.live, settings.audit_queue, keep, idle_s, settings.audit_quiet_s,
                                  went_idle)
        self.issued: Counter[str] = Counter()

    @property
    def rate(self) -> float:
        """The share of consenting plans audited (QPART_AUDIT_RATE)."""
        return self.settings.audit_rate

    def expected_bytes(self, model: LoadedModel, exchange_bytes: int = 0) -> float:
        """The upload an audit adds (one sample's float32 input, plus ``exchange_bytes`` of HTTP), times
        the audit rate: what a consenting request is priced for."""
        return self.rate * (float_packet_bytes((1, *model.artifact.input_shape)) + exchange_bytes)

    def issue(self, model: LoadedModel, pattern: Pattern) -> Ticket | None:
        """An audit for a plan of ``pattern`` (drawn at the rate; None: not audited)."""
        reference = None
        data = model.artifact.data
        if pattern.test_disagreement is not None and data is not None:
            reference = reference_bound(pattern.test_disagreement, data.test_samples,
                                        self.settings.audit_delta)
        # The level bounds the top-1 disagreement itself only under the label-free metric; under a
        # labelled one (top1-drop) it bounds a drop that is at most the disagreement, so live
        # disagreement above the level breaks nothing by itself: no promised level is exported.
        promised = model.artifact.metric == Top1Agreement.name
        ticket = self.book.issue(model.name, model.version, pattern.pattern_id, pattern.level, reference,
                                 promised=promised)
        if ticket is not None:
            self.issued[model.name] += 1
        return ticket

    def record(self, audit_id: str, model: str, version: str, pattern_id: str,
               answers: np.ndarray) -> int | None:
        """Record one of a tail request's top-1 answers, chosen at random, under the audit it names:
        which sample the device uploads (None: it names no audit)."""
        return self.book.record(audit_id, model, version, pattern_id, answers)

    def upload(self, audit_id: str, body: bytes, model_of: Callable[[str, str], LoadedModel],
               top_one: Callable[[LoadedModel], TopOne]) -> tuple[int, bool]:
        """Take an audit's raw input (a float32 activation packet of ``[1, *input_shape]``: the sample
        the tail answer named) and queue it for the float model: (samples, queued). Nothing is
        counted for a refused upload.

        Raises:
            NotFoundError, GoneError, ConflictError: see :meth:`AuditBook.take` (nothing taken).
            PayloadTooLargeError, BadRequestError: the body is not the inputs the answers were for
                (the audit stays open for a correct upload).
        """
        ticket = self.book.peek(audit_id)
        model = model_of(ticket.model, ticket.version)
        assert ticket.answers is not None
        shape = (len(ticket.answers), *model.artifact.input_shape)
        want = float_packet_bytes(shape)
        if len(body) > want:
            raise PayloadTooLargeError(f"the audit's input is {want} bytes (a float32 packet of shape "
                                       f"{list(shape)}); got {len(body)}")
        try:
            x, bits, _ = decode_activation_array(body, max_elements=int(np.prod(shape)))
        except KernelError as exc:
            raise BadRequestError(f"invalid audit input: {exc}; send the raw input as a float32 "
                                  f"activation packet of shape {list(shape)}") from exc
        if bits != FLOAT_BITS or tuple(x.shape) != shape:
            raise BadRequestError(f"the audit's input must be a float32 packet of shape {list(shape)} (the "
                                  f"sample its tail answer named in Qpart-Audit-Sample); got {bits} bits, "
                                  f"shape {list(x.shape)}")
        ticket = self.book.take(audit_id)
        queued = self.worker.submit(AuditJob(ticket, x, top_one(model)))
        return shape[0], queued

    def close(self) -> None:
        """Stop the worker."""
        self.worker.close()

    def collector(self) -> Collector:
        """The audit's Prometheus series, read at scrape time."""
        return _AuditCollector(self)


class _AuditCollector(Collector):
    def __init__(self, audits: Audits) -> None:
        self._audits = audits

    def collect(self) -> Iterator[Metric]:
        a = self._audits
        issued = CounterMetricFamily("qpart_audits_issued", "Plans marked for a live audit (ADR 0024).",
                                     labels=["model"])
        for model, n in sorted(a.issued.items()):
            issued.add_metric([model], n)
        dropped = CounterMetricFamily(
            "qpart_audit_dropped", "Audit uploads taken but not checked: queue_full (QPART_AUDIT_QUEUE "
            "audits were waiting), failed (the float model raised; logged), shutdown (queued at exit).",
            labels=["model", "reason"])
        for (model, reason), n in sorted(list(a.worker.dropped.items())):
            dropped.add_metric([model, reason], n)
        skipped = CounterMetricFamily(
            "qpart_audits_skipped", "Plans drawn for an audit but not marked: QPART_AUDIT_OPEN_MAX audits "
            "were open.", labels=["model"])
        for model, n in sorted(list(a.book.skipped_full.items())):
            skipped.add_metric([model], n)
        labels = ["model", "version", "level"]
        windowed = [*labels, "window"]
        samples = CounterMetricFamily("qpart_audit_samples", "Audited samples compared with the float "
                                      "model.", labels=labels)
        agreed = CounterMetricFamily("qpart_audit_agreed", "Audited samples whose answer had the float "
                                     "model's top-1.", labels=labels)
        lower = GaugeMetricFamily(
            "qpart_audit_disagreement_lower", "Lower end of the anytime-valid confidence sequence on the "
            "live top-1 disagreement with the float model, in the current window of QPART_AUDIT_WINDOW "
            "audited samples (window=current) and at the end of the last complete one (previous); over "
            "all windows, wrong at most QPART_AUDIT_DELTA of the time.", labels=windowed)
        upper = GaugeMetricFamily("qpart_audit_disagreement_upper", "Upper end of that confidence "
                                  "sequence.", labels=windowed)
        window = GaugeMetricFamily("qpart_audit_window", "The current window's number (1, 2, ...).",
                                   labels=labels)
        window_samples = GaugeMetricFamily("qpart_audit_window_samples", "Audited samples in the current "
                                           "window.", labels=labels)
        promised = GaugeMetricFamily("qpart_audit_promised_level", "The level the audited patterns "
                                     "promise, where it bounds this disagreement (top1-agreement "
                                     "artifacts; absent under a labelled metric).", labels=labels)
        reference = GaugeMetricFamily(
            "qpart_audit_test_disagreement_upper", "The test split's disagreement of the audited "
            "patterns, upper bound at 1 - QPART_AUDIT_DELTA (absent: the artifact has none).", labels=labels)
        for view in a.live.snapshot():
            key = [view.model, view.version, str(view.level)]
            samples.add_metric(key, view.audited)
            agreed.add_metric(key, view.agreed)
            for name, interval in (("current", view.current), ("previous", view.previous)):
                if interval is not None:
                    lower.add_metric([*key, name], interval.lower)
                    upper.add_metric([*key, name], interval.upper)
            window.add_metric(key, view.window)
            window_samples.add_metric(key, view.current.samples)
            if view.promised:
                promised.add_metric(key, view.level)
            if view.reference is not None:
                reference.add_metric(key, view.reference)
        yield from (issued, skipped, dropped, samples, agreed, lower, upper, window, window_samples, promised,
                    reference)
        yield GaugeMetricFamily("qpart_audit_queue_depth", "Audits waiting for the float model.",
                                value=a.worker.depth())
