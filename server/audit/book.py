"""Which plans are audited, and what each audit has seen so far (ADR 0024).

An audit is issued with a plan the device consented to audit, at the rate QPART_AUDIT_RATE; the
tail request that names it (the ``Qpart-Audit`` header) has one of its samples picked at random and
the top-1 answer it gave recorded; the device's upload of that sample's raw input then takes it,
once. Everything is bounded: at most
QPART_AUDIT_OPEN_MAX audits are open, each for QPART_AUDIT_TTL_S, and as many expired and as many
finished ids are remembered (to say 410 or 409 rather than 404).
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qpart.server.errors import ConflictError, GoneError, NotFoundError


@dataclass
class Ticket:
    """One open audit: the plan it belongs to and, once its tail request came, the answers given."""

    id: str
    model: str
    version: str
    pattern_id: str
    level: float
    reference: float | None  # the pattern's test-split disagreement, upper bound (None: not measured)
    expires: float  # on the book's clock
    answers: np.ndarray | None = field(default=None, repr=False)  # the audited sample's top-1 answer, [1]
    sample: int | None = None  # which sample of its tail request is audited (chosen at random)
    batch: int = 0  # the samples of that tail request
    uploaded: bool = False
    ttl_s: float = 0.0  # how long it was open for when issued
    promised: bool = False  # the level bounds this disagreement (a top1-agreement artifact)


class AuditBook:
    """Open audits by id, issued at ``rate`` (thread-safe: the event loop and the worker share it)."""

    def __init__(self, rate: float, ttl_s: float, open_max: int, *, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.ttl_s = ttl_s
        self.open_max = open_max
        self._rng = rng or random.Random()  # sampling; the ids come from secrets
        self._clock = clock
        self._open: OrderedDict[str, Ticket] = OrderedDict()  # by issue time, so by expiry
        self._expired: OrderedDict[str, None] = OrderedDict()  # ids past their time (410)
        self._done: OrderedDict[str, None] = OrderedDict()  # ids whose input came (409 again)
        self._lock = threading.Lock()
        self.skipped_full: Counter[str] = Counter()  # per model: drawn while open_max audits were open

    def issue(self, model: str, version: str, pattern_id: str, level: float,
              reference: float | None, *, promised: bool = False) -> Ticket | None:
        """A new audit for this plan, drawn at the book's rate (None: not audited)."""
        if self.rate <= 0 or self._rng.random() >= self.rate:
            return None
        with self._lock:
            self._prune()
            if len(self._open) >= self.open_max:
                self.skipped_full[model] += 1
                return None
            ticket = Ticket(secrets.token_urlsafe(18), model, version, pattern_id, level, reference,
                            self._clock() + self.ttl_s, ttl_s=self.ttl_s, promised=promised)
            self._open[ticket.id] = ticket
            return ticket

    def record(self, audit_id: str, model: str, version: str, pattern_id: str,
               answers: np.ndarray) -> int | None:
        """Pick one sample of the tail request that named ``audit_id`` at random and record the
        top-1 answer it got (``answers``: one per sample); which sample (None, nothing recorded,
        when it names no open audit of this plan, or one already answered: the answer itself is
        never refused for it). One sample per audit: the samples of one request (frames of one
        scene) may be alike, and the statistics count each audit as an independent trial."""
        with self._lock:
            self._prune()
            ticket = self._open.get(audit_id)
            if (ticket is None or ticket.model != model or ticket.version != version
                    or ticket.pattern_id != pattern_id or len(answers) < 1):
                return None
            if ticket.answers is not None:  # answered before: a retry of that request keeps its pick
                return ticket.sample if len(answers) == ticket.batch else None
            ticket.sample, ticket.batch = self._rng.randrange(len(answers)), len(answers)
            ticket.answers = np.array(answers[ticket.sample : ticket.sample + 1], dtype=np.int64)
            return ticket.sample

    def take(self, audit_id: str) -> Ticket:
        """The audit an input upload is for, marked uploaded (a second upload is refused); raises as
        :meth:`peek` does."""
        with self._lock:
            ticket = self._ready(audit_id)
            ticket.uploaded = True
            del self._open[audit_id]  # its slot is free; its id is remembered as done
            self._remember(self._done, audit_id)
            return ticket

    def peek(self, audit_id: str) -> Ticket:
        """The audit an input upload is for, if it takes one now (nothing is marked).

        Raises:
            NotFoundError: no such audit (never issued, or its plan was not marked for audit).
            GoneError: it expired (QPART_AUDIT_TTL_S).
            ConflictError: its tail request has not come yet, or its input was uploaded already.
        """
        with self._lock:
            return self._ready(audit_id)

    def _ready(self, audit_id: str) -> Ticket:
        self._prune()
        ticket = self._open.get(audit_id)
        if ticket is None:
            if audit_id in self._done:
                raise ConflictError(f"audit '{audit_id[:32]}' has its input already; each audit takes "
                                    "one upload")
            if audit_id in self._expired:
                raise GoneError(f"audit '{audit_id[:32]}' expired: its input must come within "
                                f"{self.ttl_s:g} s of its plan (QPART_AUDIT_TTL_S)")
            raise NotFoundError(f"no audit '{audit_id[:32]}': the id is unknown, or its plan was not "
                                "marked for audit (the plan's 'audit' field gives the id)")
        if ticket.answers is None:
            raise ConflictError(f"audit '{audit_id[:32]}' has no answer yet: send its tail request "
                                "first, with the header 'Qpart-Audit', then upload the input")
        return ticket

    def open_count(self) -> int:
        """Audits open now."""
        with self._lock:
            self._prune()
            return len(self._open)

    def _prune(self) -> None:
        now = self._clock()
        while self._open:
            first = next(iter(self._open.values()))
            if first.expires > now:
                break
            del self._open[first.id]
            self._remember(self._expired, first.id)

    def _remember(self, ids: OrderedDict[str, None], audit_id: str) -> None:
        ids[audit_id] = None
        if len(ids) > self.open_max:
            ids.popitem(last=False)
