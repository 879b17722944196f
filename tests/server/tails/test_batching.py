"""Dynamic batching: concurrent requests share a batch; a full queue sheds with a typed error."""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from qpart.server.errors import BadRequestError, OverloadedError, PayloadTooLargeError, TailFailedError
from qpart.server.tails.batching import Batcher, BatchReport


def _gate():
    """A batch function that blocks until the returned event is set."""
    gate = threading.Event()

    def gated(batch):
        gate.wait(5)
        return batch

    return gate, gated


def _echo(batch):
    return batch


def test_concurrent_requests_are_batched_and_answered_in_order():
    reports: list[BatchReport] = []

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=16, max_delay_s=0.05, max_queue=100, retry_after_s=1,
                              on_batch=reports.append)
            inputs = [np.full((1, 3), i, dtype=np.float32) for i in range(10)]
            outs = await asyncio.gather(*(batcher.submit("k", lambda b: b * 2, x) for x in inputs))
            await batcher.close()
        return outs

    outs = asyncio.run(main())
    for i, (out, queue_s, compute_s) in enumerate(outs):
        assert np.array_equal(out, np.full((1, 3), 2 * i)) and queue_s >= 0 and compute_s >= 0
    assert max(r.size for r in reports) > 1


def test_a_full_queue_raises_overloaded_with_retry_after():
    gate, slow = _gate()

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=1, max_delay_s=0, max_queue=2, retry_after_s=3)
            running = asyncio.create_task(batcher.submit("k", slow, np.zeros((2, 1), np.float32)))
            await asyncio.sleep(0.05)  # the first batch is now executing, blocked on the gate
            queued = asyncio.create_task(batcher.submit("k", slow, np.zeros((2, 1), np.float32)))
            await asyncio.sleep(0.05)
            with pytest.raises(OverloadedError) as info:
                await batcher.submit("k", slow, np.zeros((1, 1), np.float32))
            assert info.value.retry_after_s == 3
            gate.set()
            await asyncio.gather(running, queued)
            await batcher.close()

    asyncio.run(main())


def test_a_failing_batch_fails_its_requests_not_the_batcher(caplog):
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)

            def boom(batch):
                raise ValueError("bad batch")

            with pytest.raises(TailFailedError, match="ValueError"):  # a 500 that says it is a bug
                await batcher.submit("a", boom, np.zeros((1, 1), np.float32))
            out, _, _ = await batcher.submit("b", lambda b: b + 1, np.zeros((1, 1), np.float32))
            assert out[0, 0] == 1
            await batcher.close()

    asyncio.run(main())
    assert "tail batch for a failed" in caplog.text


def test_after_a_failing_batch_the_same_key_serves_the_next_request():
    calls = []

    def fails_once(batch):
        calls.append(batch.shape[0])
        if len(calls) == 1:
            raise RuntimeError("injected tail failure")
        return batch + 1

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)
            with pytest.raises(TailFailedError):
                await batcher.submit("k", fails_once, np.zeros((1, 1), np.float32))
            out, _, _ = await asyncio.wait_for(batcher.submit("k", fails_once, np.zeros((1, 1))), 2)
            assert out[0, 0] == 1 and batcher.stalled() == []
            await batcher.close()

    asyncio.run(main())


def test_an_empty_batch_is_refused_before_it_is_queued():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)
            with pytest.raises(BadRequestError, match="batch dimension is 0"):
                await batcher.submit("k", lambda b: b, np.zeros((0, 1), np.float32))
            assert batcher.depth() == {}
            out, _, _ = await asyncio.wait_for(batcher.submit("k", lambda b: b + 1, np.zeros((1, 1))), 2)
            assert out[0, 0] == 1
            await batcher.close()

    asyncio.run(main())


def test_a_request_larger_than_the_queue_is_413_not_overload():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)
            with pytest.raises(PayloadTooLargeError, match="capacity of 10"):
                await batcher.submit("k", lambda b: b, np.zeros((11, 1), np.float32))
            await batcher.close()

    asyncio.run(main())


def test_a_dead_collector_is_restarted_and_serves_what_waited_for_it(caplog):
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)
            take = batcher._take

            async def broken(lane):  # the collector dies of something outside any batch, once
                batcher._take = take
                raise RuntimeError("collector bug")

            batcher._take = broken
            out, _, _ = await asyncio.wait_for(batcher.submit("k", lambda b: b + 1, np.ones((1, 1))), 2)
            assert out[0, 0] == 2 and batcher.stalled() == []
            await batcher.close()

    asyncio.run(main())
    assert "tail collector for k died" in caplog.text and "restarting it" in caplog.text


def test_a_stopped_collector_is_reported_stalled_and_restarted_by_the_next_request():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1)
            await batcher.submit("k", lambda b: b, np.zeros((1, 1), np.float32))
            task = batcher._lanes["k"].task
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert batcher.stalled() == ["k"]  # readiness reads this
            out, _, _ = await asyncio.wait_for(batcher.submit("k", lambda b: b, np.ones((1, 1))), 2)
            assert out[0, 0] == 1 and batcher.stalled() == []
            await batcher.close()

    asyncio.run(main())


def test_with_no_delay_requests_queued_during_a_batch_form_the_next_one():
    """Eager batching (the default, delay 0): a lone request runs at once, alone; the requests
    that arrive while it computes are taken together as the next batch."""
    reports: list[BatchReport] = []
    gate, gated = _gate()

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=8, max_delay_s=0, max_queue=100, retry_after_s=1,
                              on_batch=reports.append)
            first = asyncio.create_task(batcher.submit("k", gated, np.zeros((1, 1), np.float32)))
            await asyncio.sleep(0.05)  # the first batch is executing, blocked on the gate
            rest = [asyncio.create_task(batcher.submit("k", gated, np.full((1, 1), i, np.float32)))
                    for i in range(5)]
            await asyncio.sleep(0.05)
            gate.set()
            outs = await asyncio.gather(first, *rest)
            await batcher.close()
        return outs

    outs = asyncio.run(main())
    assert [r.size for r in reports] == [1, 5]
    assert [float(o[0][0, 0]) for o in outs[1:]] == [0, 1, 2, 3, 4]


def test_a_batch_reports_how_long_the_pool_idled_before_it_and_none_if_it_shared_the_workers():
    """Idle time is taken across keys: a batch that begins while another key's runs, or during
    which another begins, found no idle pool (server.tails.tail_times prices lone tails from those that
    did). Two workers, so the two keys' batches really run side by side."""
    reports: list[BatchReport] = []
    gate, gated = _gate()

    async def main():
        with ThreadPoolExecutor(2) as pool:
            started = threading.Barrier(2)
            list(pool.map(lambda _: started.wait(5), range(2)))  # both worker threads exist
            batcher = Batcher(pool, max_batch=8, max_delay_s=0, max_queue=100, retry_after_s=1,
                              on_batch=reports.append)
            x = np.zeros((1, 1), np.float32)
            await batcher.submit("a", _echo, x)  # the first batch: nothing ran before it
            await asyncio.sleep(0.05)
            await batcher.submit("a", _echo, x)  # alone, after 50 ms of nothing
            slow = asyncio.create_task(batcher.submit("c", gated, x))
            await asyncio.sleep(0.05)  # "c" is running, blocked on the gate
            await batcher.submit("b", _echo, x)  # runs beside it on the other worker
            gate.set()
            await slow
            await batcher.submit("b", _echo, x)  # right after
            await batcher.close()

    asyncio.run(main())
    idle = {i: r.idle_s for i, r in enumerate(reports)}
    assert idle[0] == math.inf and 0.04 < idle[1] < 1.0
    assert [r.key for r in reports] == ["a", "a", "b", "c", "b"]  # the blocked batch finished last
    assert idle[2] == 0.0 and idle[3] == 0.0  # each shared the workers with the other
    assert 0.0 < idle[4] < 0.04


def test_close_fails_queued_and_running_requests_with_503_instead_of_hanging():
    gate, gated = _gate()

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=1, max_delay_s=0, max_queue=10, retry_after_s=1)
            running = asyncio.create_task(batcher.submit("k", gated, np.zeros((1, 1), np.float32)))
            await asyncio.sleep(0.05)
            queued = asyncio.create_task(batcher.submit("k", gated, np.zeros((1, 1), np.float32)))
            await asyncio.sleep(0.05)
            closing = asyncio.create_task(batcher.close())
            await asyncio.sleep(0.05)
            gate.set()
            await closing
            with pytest.raises(OverloadedError):  # a 503 with Retry-After, not a hang or a 500
                await asyncio.wait_for(queued, 2)
            with pytest.raises(OverloadedError):  # the batch that was running fails the same way
                await asyncio.wait_for(running, 2)

    asyncio.run(main())


def test_a_failing_metrics_callback_does_not_stop_the_collector(caplog):
    def broken(report):
        raise RuntimeError("metrics backend down")

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=4, max_delay_s=0, max_queue=10, retry_after_s=1,
                              on_batch=broken)
            first, _, _ = await asyncio.wait_for(batcher.submit("k", lambda b: b + 1, np.zeros((1, 1))), 2)
            second, _, _ = await asyncio.wait_for(batcher.submit("k", lambda b: b + 2, np.zeros((1, 1))), 2)
            await batcher.close()
        return first, second

    first, second = asyncio.run(main())
    assert first[0, 0] == 1 and second[0, 0] == 1  # the key's run function is the first one given
    assert "recording batch metrics failed" in caplog.text


def test_close_fails_requests_that_wait_for_company_instead_of_leaving_them_hanging():
    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(pool, max_batch=16, max_delay_s=5.0, max_queue=100, retry_after_s=2)
            waiting = asyncio.create_task(batcher.submit("k", lambda b: b, np.ones((1, 2), np.float32)))
            await asyncio.sleep(0.05)  # taken into a batch that waits up to 5 s for more
            await batcher.close()
            with pytest.raises(OverloadedError):
                await asyncio.wait_for(waiting, 1.0)

    asyncio.run(main())
