"""The validation stage: per cut, every level's pattern chosen by Learn then Test and measured once
on the test split, in worker processes when the machine has cores to spare.

Cuts are independent (each has its own ladders, caches and float tail), so they are the unit of
work: a pool of ``workers`` processes, each with its own runner and ``threads // workers`` torch
threads, takes one cut at a time. A worker rebuilds the runner from the model's spec and receives
the samples once, when it starts. The artifact records the worker count, because torch's float
rounding may depend on the threads a worker uses.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing as mp
import os
import queue
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from qpart.kernels import packed_size
from qpart.models.registry import ModelSpec
from qpart.offline.allocation import Item, pattern_noise, qpart_paper_bits
from qpart.offline.errors import CheckpointMismatchError, WorkerError
from qpart.offline.memory import allocator_environment, keep_freed_memory
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import Data
from qpart.offline.selection import Selection, select
from qpart.offline.settings import CalibrationSettings
from qpart.offline.sizing import lossless_levels
from qpart.offline.state import State, evaluate_test, key, split_bits
from qpart.offline.validation import PairedDrop, predicted_drop
from qpart.profiles.artifacts import FLOAT_BITS, AccuracyPoint, Pattern

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

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


def fewest_sizes(runner: ModelRunner, cut: int, min_bits: int) -> tuple[int, int]:
    """The fewest (head segment payload bytes, activation bytes per sample) any pattern at ``cut``
    can have: each tensor and the activation at ``min_bits`` or float32, whichever takes fewer bytes
    (a small tensor's scales can outweigh its float values). A lower bound of :func:`sizes`."""
    weight_bytes = 4 * runner.float_params(cut)
    for t in runner.head_tensors(cut):
        weight_bytes += min(4 * t.params, packed_size(t.params, min_bits) + 8 * t.shape[0])
    n = runner.cuts[cut].numel
    act_bytes = 0 if cut == len(runner.cuts) - 1 else min(
        4 * n, packed_size(n, min_bits) + 8 * (n // runner.groups[cut]))
    return weight_bytes, act_bytes


def pattern_id(cut: int, bits: dict[str, int]) -> str:
    """A pattern's id: its cut and a digest of its cut and bits."""
    return f"c{cut}-" + hashlib.sha256(key(cut, bits).encode()).hexdigest()[:16]


def _id_fits(cut: int, pattern: Pattern) -> bool:
    """``pattern``'s id is the one its cut and bits make (the activation's bits are in the key, or
    absent from it when it stays float32, as at the last cut)."""
    weights = dict(pattern.weight_bits)
    ids = {pattern_id(cut, {**weights, "@activation": pattern.activation_bits})}
    if pattern.activation_bits >= FLOAT_BITS:
        ids.add(pattern_id(cut, weights))
    return pattern.cut == cut and pattern.pattern_id in ids


def _pattern(st: State, cut: int, level: float, bits: dict[str, int], points: list[AccuracyPoint],
             chosen: Selection | None = None) -> Pattern:
    """The artifact's record of ``bits``; ``chosen``: how the ladder chose them (None: lossless, or
    the baseline, not tested)."""
    weights, act = split_bits(bits)
    noise = pattern_noise(st.items[cut], bits)
    test, flips = evaluate_test(st, cut, bits) if st.settings.measure_test else (None, None)
    wb, fp32, ab = sizes(st.runner, cut, bits)
    check = chosen.check if chosen else None
    return Pattern(
        pattern_id=pattern_id(cut, bits), cut=cut, level=level, weight_bits=weights,
        activation_bits=act, group_size=st.runner.groups[cut], predicted_noise=noise,
        predicted_drop=predicted_drop(points, noise),
        calib_drop=check.drop if check else None,
        calib_drop_ub=check.upper_bound(st.settings.confidence, st.settings.bound) if check else None,
        test_drop=test.drop if test else None, test_disagreement=flips.drop if flips else None,
        weight_bytes=wb, fp32_weight_bytes=fp32,
        activation_bytes=ab, rungs=chosen.rungs if chosen else None,
        passed=chosen.passed if chosen else None,
    )


CutRecord = dict[str, Any]
"""One cut's results so far, as its checkpoint holds them (JSON): ``lossless``, the lossless
pattern; ``levels``, per level done, in order, ``pattern``, ``baseline`` (QPART's as published, or
None) and ``anchor`` (where the next level's search starts)."""

Save = Callable[[int, CutRecord], None]
"""Called with a cut's record each time it grows: once for the lossless pattern, once per level."""


def record_steps(record: CutRecord | None) -> int:
    """How many of a cut's ``levels + 1`` steps ``record`` holds."""
    return 0 if not record else int("lossless" in record) + len(record.get("levels", []))


def record_patterns(record: CutRecord) -> tuple[list[Pattern], list[Pattern]]:
    """The patterns (lossless first, then per level) and QPART's of a finished record."""
    levels = record["levels"]
    patterns = [Pattern.model_validate(x) for x in (record["lossless"], *(x["pattern"] for x in levels))]
    return patterns, [Pattern.model_validate(x["baseline"]) for x in levels if x["baseline"] is not None]


def check_record(cut: int, record: CutRecord) -> None:
    """Refuse (:class:`CheckpointMismatchError`, one line) a resumed record of ``cut`` holding a
    pattern whose id is not the one its bits make: its bits were edited and its seal recomputed
    (ADR 0021), and an artifact would serve them under the old id."""
    try:
        levels = record.get("levels", [])
        found = [record["lossless"]] if "lossless" in record else []
        found += [x[k] for x in levels for k in ("pattern", "baseline") if x[k] is not None]
        patterns = [Pattern.model_validate(x) for x in found]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointMismatchError(
            f"the checkpoint of cut {cut} (cut-{cut}.json) is not a record this job wrote "
            f"({type(exc).__name__}); run again with --fresh to discard the checkpoints and start "
            "afresh") from exc
    for p in patterns:
        if not _id_fits(cut, p):
            raise CheckpointMismatchError(
                f"the checkpoint of cut {cut} (cut-{cut}.json) holds pattern {p.pattern_id!r} whose "
                "bits do not make its id (edited, and its seal recomputed), so it cannot be trusted; "
                "run again with --fresh to discard the checkpoints and start afresh")


def cut_patterns(st: State, cut: int, plan: Plan, record: CutRecord | None, save: Save) -> CutRecord:
    """The lossless pattern and one pattern per level at ``cut`` (and QPART's, as published),
    continuing ``record`` (what a killed job had finished of this cut)."""
    s = st.settings
    rec: CutRecord = dict(record) if record else {}
    if "lossless" not in rec:
        lossless = {it.name: FLOAT_BITS for it in st.items[cut]}
        first = _pattern(st, cut, 0.0, lossless, plan.points)
        rec = {"lossless": first.model_dump(mode="json"), "levels": []}
        save(cut, rec)
    levels: list[dict[str, Any]] = list(rec["levels"])
    floor = levels[-1]["anchor"] if levels else None
    kept = lossless_levels(s)
    for level in s.levels[len(levels):]:
        budget = plan.budgets[str(level)]
        if level in kept:  # --uncertified lossless: no check sample count could pass it
            floor, lossless = None, {it.name: FLOAT_BITS for it in st.items[cut]}
            pattern = _pattern(st, cut, level, lossless, plan.points)
        else:
            chosen = select(st, cut, level, budget, floor)
            floor = chosen.anchor
            pattern = _pattern(st, cut, level, chosen.bits, plan.points, chosen)
        paper = (_pattern(st, cut, level, qpart_paper_bits(st.items[cut], budget), plan.points)
                 if s.baseline and st.items[cut] and budget > 0 else None)
        levels.append({"pattern": pattern.model_dump(mode="json"),
                       "baseline": paper.model_dump(mode="json") if paper else None, "anchor": floor})
        rec = {"lossless": rec["lossless"], "levels": list(levels)}
        save(cut, rec)
    return rec


# -- worker processes ---------------------------------------------------------------------------

_WORKER: tuple[State, Plan, mp.Queue[tuple[int, CutRecord]]] | None = None
_WORKER_FAILED = ""


def _init_worker(spec: ModelSpec, settings: CalibrationSettings, data: Data, items: dict[int, list[Item]],
                 fit_cache: dict[str, PairedDrop], plan: Plan, threads: int,
                 events: mp.Queue[tuple[int, CutRecord]]) -> None:
    """Build this worker's state; a failure is kept and raised by its first task, so that the job
    ends with the reason (an initializer that raises would only break the pool)."""
    global _WORKER, _WORKER_FAILED  # noqa: PLW0603 (one state per worker process, set once)
    _die_with_parent()
    try:
        _WORKER = (worker_state(spec, settings, data, items, fit_cache, threads), plan, events)
    except Exception as exc:
        _WORKER_FAILED = f"{type(exc).__name__}: {exc}"


def worker_state(spec: ModelSpec, settings: CalibrationSettings, data: Data, items: dict[int, list[Item]],
                 fit_cache: dict[str, PairedDrop], threads: int) -> State:
    """The state a process other than the job's validates cuts with: its own runner, ``threads``
    torch threads, the job's seed (a Ray task builds the same, so both give the same results)."""
    import torch  # noqa: PLC0415 (in the child, after the start method chose how to import)

    keep_freed_memory()
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=settings.batch_size,
                         largest_group=settings.activation_group, device=settings.device)
    return State(runner, data, settings, items, dict(fit_cache))


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the job's process dies (even by SIGKILL), so that no
    orphan goes on computing a cut nobody will save."""
    with suppress(OSError, AttributeError):  # not Linux: an orphan ends when it next reports
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _run_cut(cut: int, record: CutRecord | None) -> tuple[int, CutRecord]:
    if _WORKER is None:
        raise WorkerError(f"a validation worker could not start: {_WORKER_FAILED}")
    st, plan, events = _WORKER
    return cut, cut_patterns(st, cut, plan, record, lambda c, rec: events.put((c, rec)))


Executor = Callable[[ModelSpec, State, Plan, int, dict[int, CutRecord | None], Save], None]
"""Validates the cuts of a mapping (each continuing its record) on ``workers`` processes of
``threads // workers`` torch threads each, calling ``save`` with each record that grows."""


def all_patterns(spec: ModelSpec, st: State, cuts: list[int], plan: Plan, workers: int,
                 advance: Advance, records: dict[int, CutRecord], save: Save,
                 executor: Executor | None = None) -> tuple[list[Pattern], list[Pattern]]:
    """Every cut's patterns, in cut order, continuing ``records`` (a killed job's, by cut) and
    calling ``save`` as each grows: in this process when ``workers`` is 1, else in ``workers``
    spawned processes (spawned: forking a process that holds torch's thread pools can deadlock),
    or by ``executor`` (``offline.ray_executor``) when given. A worker's error ends the job with
    it; a worker that dies is a :class:`WorkerError`."""
    found = {c: r for c, r in records.items() if c in cuts}
    for cut, record in found.items():
        check_record(cut, record)
    steps = len(st.settings.levels) + 1

    def keep(cut: int, rec: CutRecord) -> None:  # reports may arrive late: never save an older one
        if record_steps(rec) > record_steps(found.get(cut)):
            found[cut] = rec
            save(cut, rec)
            advance(sum(record_steps(found.get(c)) for c in cuts))

    advance(sum(record_steps(found.get(c)) for c in cuts))
    todo = [c for c in cuts if record_steps(found.get(c)) < steps]
    if executor is not None and todo:
        executor(spec, st, plan, workers, {c: found.get(c) for c in todo}, keep)
    elif workers <= 1:
        for cut in todo:
            cut_patterns(st, cut, plan, found.get(cut), keep)
    elif todo:
        _in_workers(spec, st, plan, workers, {c: found.get(c) for c in todo}, keep)
    patterns: list[Pattern] = []
    baseline: list[Pattern] = []
    for cut in cuts:
        mine, paper = record_patterns(found[cut])
        patterns += mine
        baseline += paper
    return patterns, baseline


def _in_workers(spec: ModelSpec, st: State, plan: Plan, workers: int, todo: dict[int, CutRecord | None],
                keep: Save) -> None:
    """The cuts of ``todo`` (each continuing its record) in a pool of ``workers`` processes."""
    ctx = mp.get_context("spawn")
    events: mp.Queue[tuple[int, CutRecord]] = ctx.Queue()
    threads = max(1, st.settings.threads // workers)
    args = (spec, st.settings, st.data, st.items, st.fit_cache, plan, threads, events)
    with _environment(allocator_environment()), ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=args) as pool:
        pending = {pool.submit(_run_cut, cut, record) for cut, record in todo.items()}
        try:
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                _drain(events, keep)
                for future in finished:
                    keep(*future.result())
        except BrokenProcessPool as exc:
            raise WorkerError(f"a validation worker died ({exc}); if it ran out of memory, "
                              "set QPART_CALIB_WORKERS=1") from exc
        except BaseException:  # SIGTERM (SystemExit), Ctrl-C: keep what is reported, stop the rest now
            _drain(events, keep)
            _stop(pool)
            raise
        finally:
            for future in pending:
                future.cancel()


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers now: leaving the ``with`` block would wait for their running cuts
    (39 s in a review's run, past a container's grace period), whose results nobody would save."""
    for process in list((pool._processes or {}).values()):  # no public way to end them
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


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


def _drain(events: mp.Queue[tuple[int, CutRecord]], keep: Save) -> None:
    """Save every record the workers reported so far."""
    while True:
        try:
            keep(*events.get_nowait())
        except queue.Empty:
            return
