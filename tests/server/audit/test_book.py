"""Audits are issued at the rate, bounded in number and time, answered once and uploaded once."""

from __future__ import annotations

import random

import numpy as np
import pytest

from qpart.server.audit import AuditBook
from qpart.server.errors import ConflictError, GoneError, NotFoundError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _book(rate: float = 1.0, ttl_s: float = 10.0, open_max: int = 4) -> tuple[AuditBook, Clock]:
    clock = Clock()
    return AuditBook(rate, ttl_s, open_max, rng=random.Random(0), clock=clock), clock


def _issue(book: AuditBook):
    return book.issue("m", "v", "p", 0.01, None)


def test_the_rate_decides_which_plans_are_audited():
    assert _issue(_book(rate=0.0)[0]) is None
    book, _ = _book(rate=0.25, open_max=100_000)
    issued = sum(_issue(book) is not None for _ in range(20_000))
    assert 0.23 * 20_000 < issued < 0.27 * 20_000


def test_at_most_open_max_audits_are_open():
    book, clock = _book(open_max=3)
    assert all(_issue(book) is not None for _ in range(3))
    assert _issue(book) is None and book.skipped_full == {"m": 1}
    clock.now = 11  # all three expire: room again
    assert _issue(book) is not None and book.open_count() == 1


def test_an_upload_needs_the_answer_first_and_comes_once():
    book, _ = _book()
    ticket = _issue(book)
    with pytest.raises(ConflictError, match="no answer yet"):
        book.take(ticket.id)
    assert book.record(ticket.id, "m", "v", "other-pattern", np.array([1])) is None  # another plan's
    sample = book.record(ticket.id, "m", "v", "p", np.array([3, 4]))
    assert sample in (0, 1)
    assert book.record(ticket.id, "m", "v", "p", np.array([5])) is None  # a second tail request: ignored
    taken = book.take(ticket.id)
    assert taken.answers.tolist() == [[3, 4][sample]] and taken.sample == sample
    with pytest.raises(ConflictError, match="already"):
        book.take(ticket.id)
    assert book.open_count() == 0  # its slot is free once taken


def test_unknown_and_expired_audits_are_told_apart():
    book, clock = _book()
    with pytest.raises(NotFoundError, match="not marked for audit"):
        book.take("nope")
    ticket = _issue(book)
    book.record(ticket.id, "m", "v", "p", np.array([1]))
    clock.now = 10.5
    with pytest.raises(GoneError, match="QPART_AUDIT_TTL_S"):
        book.take(ticket.id)
    assert book.record(ticket.id, "m", "v", "p", np.array([1])) is None


def test_one_sample_of_a_request_is_audited_each_equally_often():
    book, _ = _book(open_max=10_000)
    picked = []
    for _ in range(4000):
        ticket = _issue(book)
        picked.append(book.record(ticket.id, "m", "v", "p", np.arange(4)))
        book.take(ticket.id)
    assert sorted(set(picked)) == [0, 1, 2, 3]
    assert all(900 < picked.count(i) < 1100 for i in range(4))


def test_remembered_ids_are_bounded():
    book, clock = _book(open_max=2, ttl_s=1.0)
    ids = []
    for step in range(10):
        clock.now = float(step * 2)
        ids.append(_issue(book).id)
    clock.now = 100.0
    book.open_count()
    with pytest.raises(NotFoundError):  # forgotten: more than open_max expired since
        book.take(ids[0])
    with pytest.raises(GoneError):
        book.take(ids[-1])


def test_the_worker_waits_for_the_tails_to_be_quiet():
    import threading
    import time

    from qpart.server.audit import AuditJob, AuditWorker, LiveDisagreement

    busy = threading.Event()
    busy.set()
    live = LiveDisagreement(0.01)
    worker = AuditWorker(live, max_queue=4, idle_s=lambda: 0.0 if busy.is_set() else 1.0, quiet_s=0.01)
    book, _ = _book()
    ticket = _issue(book)
    book.record(ticket.id, "m", "v", "p", np.array([7]))
    job = AuditJob(book.take(ticket.id), np.zeros((1, 3), np.float32), lambda x: np.array([0]))
    try:
        assert worker.submit(job)
        time.sleep(0.2)
        assert worker.checked == 0 and live.snapshot() == []  # answers are being computed: it waits
        busy.clear()
        deadline = time.monotonic() + 5
        while worker.checked == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        (view,) = live.snapshot()
        assert (view.audited, view.agreed) == (1, 0)
    finally:
        worker.close()


def test_a_retried_tail_request_is_told_the_same_sample():
    book, _ = _book()
    ticket = _issue(book)
    first = book.record(ticket.id, "m", "v", "p", np.array([3, 4, 5]))
    assert book.record(ticket.id, "m", "v", "p", np.array([9, 9, 9])) == first  # its answer was lost
    assert book.record(ticket.id, "m", "v", "p", np.array([9])) is None  # another request
    assert book.take(ticket.id).answers.tolist() == [[3, 4, 5][first]]  # the first answer stands


def _job(book: AuditBook):
    from qpart.server.audit import AuditJob

    ticket = _issue(book)
    book.record(ticket.id, "m", "v", "p", np.array([7]))
    return AuditJob(book.take(ticket.id), np.zeros((1, 3), np.float32), lambda x: np.array([7]))


def test_audits_queued_at_shutdown_are_counted():
    import threading

    from qpart.server.audit import AuditWorker, LiveDisagreement

    busy = threading.Event()
    busy.set()
    worker = AuditWorker(LiveDisagreement(0.01), max_queue=8, idle_s=lambda: 0.0, quiet_s=0.01)
    book, _ = _book(open_max=100)
    for _ in range(6):
        assert worker.submit(_job(book))
    worker.close()
    assert worker.checked == 0 and worker.dropped == {("m", "shutdown"): 6} and worker.depth() == 0


def test_the_worker_wakes_when_the_tails_go_idle():
    import threading
    import time

    from qpart.server.audit import AuditWorker, LiveDisagreement

    idle = {"s": 0.0}
    went_idle = threading.Event()
    worker = AuditWorker(LiveDisagreement(0.01), max_queue=8, idle_s=lambda: idle["s"], quiet_s=0.0,
                         went_idle=went_idle)
    book, _ = _book()
    try:
        assert worker.submit(_job(book))
        time.sleep(0.12)  # busy: two polls pass, nothing checked
        assert worker.checked == 0
        idle["s"] = 1.0
        went_idle.set()  # what the batcher does when a batch ends with none waiting
        started = time.monotonic()
        while worker.checked == 0 and time.monotonic() - started < 5:
            time.sleep(0.001)
        assert worker.checked == 1 and time.monotonic() - started < 0.03  # woken, not the 50 ms poll
    finally:
        worker.close()
