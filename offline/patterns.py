"""The validation stage: per cut, every level's pattern chosen by Learn then Test and measured once
on the test split, in worker processes when the machine has cores to spare.

Cuts are independent (each has its own ladders, caches and float tail), so they are the unit of
work: a pool of ``workers`` processes, each with its own runner and ``threads // workers`` torch
threads, takes one cut at a time. A worker rebuilds the runner from the model's spec and receives
the samples once, when it starts. The artifact records the worker count, because torch's float
rounding may depend on the threads a worker uses.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass

from qpart.kernels import packed_size
from qpart.models.registry import ModelSpec
from qpart.offline.allocation import Item, pattern_noise, qpart_paper_bits
from qpart.offline.errors import WorkerError
from qpart.offline.memory import allocator_environment, keep_freed_memory
from qpart.offline.runner import ModelRunner
from qpart.offline.selection import Selection, select
from qpart.offline.settings import CalibrationSettings
from qpart.offline.state import Data, State, evaluate, key, split_bits
from qpart.offline.validation import PairedDrop, predicted_drop
from qpart.profiles.artifacts import FLOAT_BITS, AccuracyPoint, Pattern

Done = Callable[[], None]
"""Called once per (cut, level) finished, and once per cut's lossless pattern."""

Advance = Callable[[int], None]
"""Progress: how many of ``len(cuts) * (len(levels) + 1)`` steps are done."""


@dataclass(frozen=True)
class Plan:
    """What the stage needs beyond the job's state: the mapping and each level's budget ``D(a)``."""

    budgets: dict[str, float]
    points: list[AccuracyPoint]


def resolve_workers(s: CalibrationSettings, cuts: int) -> int:
    """``s.workers``, or (0) one per torch thread the job may use, never more than the cuts. Not
    the machine's cores: the split of threads between workers can change float rounding, so the
    same settings give the same artifact on any machine."""
    return max(1, min(s.workers or s.threads, cuts))


def sizes(runner: ModelRunner, cut: int, bits: dict[str, int]) -> tuple[int, int, int]:
    """(head segment payload bytes, fp32 head bytes, activation bytes per sample)."""
    weight_bytes = 4 * runner.float_params(cut)
    fp32 = weight_bytes
    for t in runner.head_tensors(cut):
        b = bits.get(t.name, FLOAT_BITS)
        fp32 += 4 * t.params
        weight_bytes += 4 * t.params if b >= FLOAT_BITS else packed_size(t.params, b) + 8 * t.shape[0]
    c = runner.cuts[cut]
    act_bits = bits.get("@activation", FLOAT_BITS)
    if cut == len(runner.cuts) - 1:
        act_bytes = 0
    elif act_bits >= FLOAT_BITS:
        act_bytes = 4 * c.numel
    else:
        act_bytes = packed_size(c.numel, act_bits) + 8 * (c.numel // runner.groups[cut])
    return weight_bytes, fp32, act_bytes


def _pattern(st: State, cut: int, level: float, bits: dict[str, int], points: list[AccuracyPoint],
             chosen: Selection | None = None) -> Pattern:
    """The artifact's record of ``bits``; ``chosen``: how the ladder chose them (None: lossless, or
    the baseline, not tested)."""
    weights, act = split_bits(bits)
    noise = pattern_noise(st.items[cut], bits)
    test = (evaluate(st, cut, bits, st.data.test, st.data.test_correct, st.test_cache)
            if st.settings.measure_test else None)
    wb, fp32, ab = sizes(st.runner, cut, bits)
    digest = hashlib.sha256(key(cut, bits).encode()).hexdigest()[:16]
    check = chosen.check if chosen else None
    return Pattern(
        pattern_id=f"c{cut}-{digest}", cut=cut, level=level, weight_bits=weights,
        activation_bits=act, group_size=st.runner.groups[cut], predicted_noise=noise,
        predicted_drop=predicted_drop(points, noise),
        calib_drop=check.drop if check else None,
        calib_drop_ub=check.upper_bound(st.settings.confidence, st.settings.bound) if check else None,
        test_drop=test.drop if test else None, weight_bytes=wb, fp32_weight_bytes=fp32,
        activation_bytes=ab, rungs=chosen.rungs if chosen else None,
        passed=chosen.passed if chosen else None,
    )


def cut_patterns(st: State, cut: int, plan: Plan, done: Done) -> tuple[list[Pattern], list[Pattern]]:
    """The lossless pattern and one pattern per level at ``cut`` (and QPART's, as published)."""
    s = st.settings
    lossless = {it.name: FLOAT_BITS for it in st.items[cut]}
    patterns = [_pattern(st, cut, 0.0, lossless, plan.points)]
    baseline: list[Pattern] = []
    floor = None
    for level in s.levels:
        budget = plan.budgets[str(level)]
        chosen = select(st, cut, level, budget, floor)
        floor = chosen.anchor
        patterns.append(_pattern(st, cut, level, chosen.bits, plan.points, chosen))
        if s.baseline and st.items[cut] and budget > 0:
            baseline.append(_pattern(st, cut, level, qpart_paper_bits(st.items[cut], budget), plan.points))
        done()
    done()
    return patterns, baseline


# -- worker processes ---------------------------------------------------------------------------

_WORKER: tuple[State, Plan, mp.Queue[int]] | None = None
_WORKER_FAILED = ""


def _init_worker(spec: ModelSpec, settings: CalibrationSettings, data: Data, items: dict[int, list[Item]],
                 fit_cache: dict[str, PairedDrop], plan: Plan, threads: int, events: mp.Queue[int]) -> None:
    """Build this worker's state; a failure is kept and raised by its first task, so that the job
    ends with the reason (an initializer that raises would only break the pool)."""
    global _WORKER, _WORKER_FAILED  # noqa: PLW0603 (one state per worker process, set once)
    try:
        import torch  # noqa: PLC0415 (in the child, after the start method chose how to import)

        keep_freed_memory()
        torch.set_num_threads(threads)
        torch.manual_seed(settings.seed)
        runner = ModelRunner(spec.load(), spec.input_shape, batch_size=settings.batch_size,
                             largest_group=settings.activation_group)
        _WORKER = (State(runner, data, settings, items, dict(fit_cache)), plan, events)
    except Exception as exc:
        _WORKER_FAILED = f"{type(exc).__name__}: {exc}"


def _run_cut(cut: int) -> tuple[int, list[Pattern], list[Pattern]]:
    if _WORKER is None:
        raise WorkerError(f"a validation worker could not start: {_WORKER_FAILED}")
    st, plan, events = _WORKER
    found = cut_patterns(st, cut, plan, lambda: events.put(cut))
    return (cut, *found)


def all_patterns(spec: ModelSpec, st: State, cuts: list[int], plan: Plan, workers: int,
                 advance: Advance) -> tuple[list[Pattern], list[Pattern]]:
    """Every cut's patterns, in cut order: in this process when ``workers`` is 1, else in
    ``workers`` spawned processes (spawned: forking a process that holds torch's thread pools can
    deadlock). A worker's error ends the job with it; a worker that dies is a :class:`WorkerError`."""
    found: dict[int, tuple[list[Pattern], list[Pattern]]] = {}
    steps = [0]

    def done() -> None:
        steps[0] += 1
        advance(steps[0])

    if workers <= 1:
        for cut in cuts:
            found[cut] = cut_patterns(st, cut, plan, done)
    else:
        ctx = mp.get_context("spawn")
        events: mp.Queue[int] = ctx.Queue()
        threads = max(1, st.settings.threads // workers)
        args = (spec, st.settings, st.data, st.items, st.fit_cache, plan, threads, events)
        with _environment(allocator_environment()), ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=_init_worker, initargs=args) as pool:
            pending = {pool.submit(_run_cut, cut) for cut in cuts}
            try:
                while pending:
                    finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    _drain(events, done, timeout=0.0)
                    for future in finished:
                        cut, patterns, baseline = future.result()
                        found[cut] = (patterns, baseline)
            except BrokenProcessPool as exc:
                raise WorkerError(f"a validation worker died ({exc}); if it ran out of memory, "
                                  "set QPART_CALIB_WORKERS=1") from exc
            finally:
                for future in pending:
                    future.cancel()
        advance(len(cuts) * (len(st.settings.levels) + 1))  # events still in a worker's pipe
    patterns = [p for cut in cuts for p in found[cut][0]]
    baseline = [p for cut in cuts for p in found[cut][1]]
    return patterns, baseline


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while the pool spawns its workers (who inherit it)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _drain(events: mp.Queue[int], done: Done, timeout: float) -> None:
    """Report every (cut, level) the workers finished, waiting up to ``timeout`` for the first."""
    try:
        events.get(timeout=timeout) if timeout else events.get_nowait()
    except queue.Empty:
        return
    done()
    while True:
        try:
            events.get_nowait()
        except queue.Empty:
            return
        done()
