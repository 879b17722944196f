"""The validation stage as Ray tasks on an existing cluster (``qpart calibrate --executor ray``).

One task per cut, as the local pool's unit of work. Each task gets ``threads // workers`` CPUs and
as many torch threads, like a local worker, so the artifact is the same byte for byte. What a task
needs travels in Ray's object store, put once: the samples with the float model's answers, the
allocation items, the fit counts, the mapping, the settings, and the model's weights as bytes.
Samples the job holds in files (``spill_above_mb``) are read into the object store whole, which
Ray spills to its own disk when full. Nodes need no shared storage, but the model's code (its
factory's module) must be importable on every node: installed there, or sent with Ray's
``runtime_env`` (``docs/calibration-ray.md``).

A cut's levels are checkpointed when its task returns (locally: as each level ends). A cluster
that goes away ends the job with :class:`~offline.errors.ExecutorError`; the cuts saved so far
stay resumable. Ray itself fails a task already sent to a worker that died, but not one still
waiting for a worker: with the cluster's GCS gone nothing ever answers for it, and after 60 s
Ray's core worker ends the driver process with its own log line instead (seen once in CI on a
loaded host). So while no task finishes, the job checks every :data:`_WAIT_S` that something
still listens at the GCS's address (:func:`_check_gcs`).
"""

from __future__ import annotations

import importlib.util
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from qpart.models.registry import ModelSpec
from qpart.offline.errors import ExecutorError, WorkerError
from qpart.offline.memory import allocator_environment
from qpart.offline.patterns import CutRecord, Executor, Plan, Save, cut_patterns, worker_state
from qpart.offline.samples import in_memory
from qpart.offline.state import State

_WAIT_S = 1.0
_CONNECT_S = 2.0  # one check of the GCS's port waits at most this
_UNREACHABLE_S = 15.0  # a GCS that times out (not refuses) this long is gone
_STATES: dict[str, State] = {}  # per Ray worker process: the job's state, built by its first task


def _task(job: str, context: dict[str, Any], cut: int, record: CutRecord | None) -> tuple[int, CutRecord]:
    """Runs on a Ray worker: one cut's patterns, continuing ``record``."""
    state = _STATES.get(job)
    if state is None:
        with tempfile.TemporaryDirectory() as folder:
            weights = Path(folder) / "weights.safetensors"
            weights.write_bytes(context["weights"])
            spec = replace(context["spec"], weights=weights)
            state = worker_state(spec, context["settings"], context["data"], context["items"],
                                 context["fit_cache"], context["threads"])
        _STATES.clear()  # one job at a time per worker process
        _STATES[job] = state
    return cut, cut_patterns(state, cut, context["plan"], record, lambda c, r: None)


def _check_gcs(address: str, unreachable_since: float | None) -> float | None:
    """Connect to the GCS at ``address`` (``host:port``) and hang up. Refused: nothing listens,
    the cluster is gone (:class:`ConnectionError`). Timed out or unreachable: perhaps only slow, so
    gone only after :data:`_UNREACHABLE_S` of that. Returns when that began (None: reached). A
    stopped (SIGSTOP) but living GCS still accepts the connection: load is no false alarm."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_S).close()
    except ConnectionRefusedError as exc:
        raise ConnectionError(f"nothing listens at the cluster's GCS address {address}") from exc
    except OSError as exc:
        since = time.monotonic() if unreachable_since is None else unreachable_since
        if time.monotonic() - since > _UNREACHABLE_S:
            raise ConnectionError(f"the cluster's GCS at {address} is unreachable") from exc
        return since
    return None


def _drain(ray: Any, pending: list[Any], keep: Save, gcs: str) -> None:
    """Keep each task's result as it comes; while none comes, check that the GCS is there."""
    unreachable_since: float | None = None
    while pending:
        finished, pending = ray.wait(pending, num_returns=1, timeout=_WAIT_S)
        for ref in finished:
            keep(*ray.get(ref))
        if not finished:
            unreachable_since = _check_gcs(gcs, unreachable_since)


NO_RAY = "--executor ray needs Ray: pip install 'qpart-serving[ray]'"


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise ExecutorError(NO_RAY)


def ray_executor(address: str | None) -> Executor:
    """An executor on the Ray cluster at ``address`` (``auto``: the one this machine belongs to;
    None: a local one started for the job, with as many CPUs as the job's threads).

    Raises:
        ExecutorError: Ray is not installed (at once, before the job's first stage); when it runs,
            the cluster cannot be reached, or it went away.
    """
    _require_ray()

    def run(spec: ModelSpec, st: State, plan: Plan, workers: int, todo: dict[int, CutRecord | None],
            keep: Save) -> None:
        try:
            import ray  # noqa: PLC0415 (an optional extra: qpart-serving[ray])
            from ray.exceptions import RayError, RayTaskError  # noqa: PLC0415
        except ImportError as exc:
            raise ExecutorError(NO_RAY) from exc
        threads = max(1, st.settings.threads // workers)
        where = address or "a local Ray instance"
        started = False
        try:
            if not ray.is_initialized():
                ray.init(address=address, num_cpus=None if address else st.settings.threads,
                         include_dashboard=False, log_to_driver=False, configure_logging=False,
                         runtime_env={"env_vars": allocator_environment()})
                started = True
            context = ray.put({"spec": spec, "settings": st.settings, "data": in_memory(st.data),
                               "items": st.items, "fit_cache": st.fit_cache, "plan": plan, "threads": threads,
                               "weights": spec.weights.read_bytes()})
            task = ray.remote(num_cpus=threads, max_retries=0)(_task)
            job = ray.get_runtime_context().get_job_id()
            pending = [task.remote(job, context, cut, record) for cut, record in todo.items()]
            _drain(ray, pending, keep, ray.get_runtime_context().gcs_address)
        except RayTaskError as exc:  # the task's own error, as the local pool would raise it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from exc
            raise WorkerError(f"a validation task failed on Ray: {exc}") from exc
        except (RayError, ConnectionError) as exc:
            raise ExecutorError(
                f"the Ray cluster at {where} failed or went away ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); the cuts finished so far are "
                "checkpointed: run the same command again to resume") from exc
        finally:
            if started:
                ray.shutdown()

    return run
