"""The hostile answers of :mod:`bench.micro.hostile_device`, each a change to one answer of a normal
run, and the stage they start from: the real server's plan for a cut-5 pattern in each runtime, its
segments and model card, and the payloads (:mod:`bench.micro.hostile_payloads`).

A case's routes are the answers it makes up on the device's origin and on the other origin (path →
answer); every other request passes to the real server. Adding a case: a function of the stage and
the runtime that returns those routes, and a :class:`Case` row in :data:`CASES`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import REPO
from bench.harness.hostile_origin import Origin, Route, answer, head_drip, stream
from bench.micro.hostile_payloads import (
    ESCAPES,
    activation_shape,
    brotli_bomb,
    gzip_bomb,
    idx_file,
    work_bomb,
)

MODEL = "fmnist-cnn"
CUT = 1  # a middle cut the committed artifact calibrates (ADR 0025 keeps 0, 1 and 8 of its 9)
LEVEL = 0.01
RUNTIMES = ("torch", "onnx")
DRIP = {"transfer_deadline_s": 5.0, "timeout_s": 3.0}
"""The settings the drip cases shrink, to end in seconds; a byte every :data:`DRIP_EVERY_S`."""
DRIP_EVERY_S = 2.0
BUSY_RETRY_AFTER_S = 9
"""What ``busy_forever`` asks to wait each time: under ``max_backoff_s``, over the shrunk deadline."""

@dataclass
class Stage:
    """What every case starts from: the two origins, and the real server's answers for a normal run."""

    origin: Origin
    foreign: Origin
    metadata: dict[str, Any]
    plans: dict[str, dict[str, Any]]
    segments: dict[str, bytes]
    idx: Path
    gzip_bomb: bytes
    brotli_bomb: bytes
    segment_metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    """What each runtime's plan wants an ONNX segment's metadata to say (model, version, cut, pattern)."""

    def plan_route(self, plan: dict[str, Any]) -> Route:
        return answer(json.dumps(plan).encode())


Routes = tuple[dict[str, Route], dict[str, Route]]
"""The origin's routes and the other origin's (each: path → answer; the rest passed on)."""


@dataclass(frozen=True)
class Case:
    """One hostile answer."""

    name: str
    what: str
    routes: Callable[[Stage, str], Routes]
    fails: bool = True
    """The device must stop with one ``error:`` line and exit status 2."""
    nothing_kept: bool = True
    """A refusal: no byte of it may stay on disk (a lost connection's ``.part`` may, to resume)."""
    settings: dict[str, float] = field(default_factory=dict)
    """Settings changed from their defaults for this case (:data:`DRIP`)."""
    runs_head: bool = False
    """Its segment may run as a head: the ONNX head's run deadline counts in the case's."""


def _with(plan: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**plan, **changes}


def _segment_with(plan: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**plan, "segment": {**plan["segment"], **changes}}


def _benign(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": s.plan_route(s.plans[rt])}, {}


def _foreign_infer(s: Stage, rt: str) -> Routes:
    plan = _with(s.plans[rt], infer_url=s.foreign.url + s.plans[rt]["infer_url"])
    return {"/v1/plan": s.plan_route(plan)}, {}


def _foreign_segment(s: Stage, rt: str) -> Routes:
    plan = _segment_with(s.plans[rt], url=s.foreign.url + s.plans[rt]["segment"]["url"])
    return {"/v1/plan": s.plan_route(plan)}, {}


def _gzip_bomb(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": answer(s.gzip_bomb, headers={"Content-Encoding": "gzip"})}, {}


def _endless_plan(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": stream(json.dumps(s.plans[rt]).encode())}, {}


def _huge_segment(s: Stage, rt: str) -> Routes:
    plan = _segment_with(s.plans[rt], size_bytes=50 << 30)
    return {"/v1/plan": s.plan_route(plan),
            plan["segment"]["url"]: stream(b"", b"\0" * (64 << 10), length=50 << 30)}, {}


def _endless_segment(s: Stage, rt: str) -> Routes:
    plan = s.plans[rt]
    return {"/v1/plan": s.plan_route(plan),
            plan["segment"]["url"]: stream(s.segments[rt], b"\0" * (64 << 10))}, {}


def _segment_cut_off(s: Stage, rt: str) -> Routes:
    plan, data = s.plans[rt], s.segments[rt]
    half = data[:len(data) // 2]
    return {"/v1/plan": s.plan_route(plan),
            plan["segment"]["url"]: stream(half, b"", length=len(data))}, {}


def _drip_plan(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": stream(json.dumps(s.plans[rt]).encode(), b" ", DRIP_EVERY_S)}, {}


def _drip_segment(s: Stage, rt: str) -> Routes:
    plan, data = s.plans[rt], s.segments[rt]
    return {"/v1/plan": s.plan_route(plan),
            plan["segment"]["url"]: stream(data[:1], data[1:2], DRIP_EVERY_S, length=len(data))}, {}


def _drip_answer(s: Stage, rt: str) -> Routes:
    plan = s.plans[rt]
    return {"/v1/plan": s.plan_route(plan),
            plan["infer_url"]: stream(b'{"results": [', b" ", DRIP_EVERY_S)}, {}


def _brotli_plan(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": answer(s.brotli_bomb, headers={"Content-Encoding": "br"})}, {}


def _stacked_plan(s: Stage, rt: str) -> Routes:
    twice = gzip.compress(s.gzip_bomb, compresslevel=9)
    return {"/v1/plan": answer(twice, headers={"Content-Encoding": "gzip, gzip"})}, {}


def _head_drip_plan(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": head_drip(DRIP_EVERY_S)}, {}


def _head_drip_segment(s: Stage, rt: str) -> Routes:
    plan = s.plans[rt]
    return {"/v1/plan": s.plan_route(plan), plan["segment"]["url"]: head_drip(DRIP_EVERY_S)}, {}


def _busy_forever(s: Stage, rt: str) -> Routes:
    busy = answer(b'{"error": "busy"}', status=503, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
    return {"/v1/plan": busy}, {}


def _escaped_labels(s: Stage, rt: str) -> Routes:
    labels = [f"{ESCAPES}{i}" for i in range(10)]
    card = {**s.metadata, "parameters": {**s.metadata["parameters"], "labels": json.dumps(labels)}}
    return {"/v1/plan": s.plan_route(s.plans[rt]),
            f"/v2/models/{MODEL}": answer(json.dumps(card).encode())}, {}


def _escaped_error(s: Stage, rt: str) -> Routes:
    return {"/v1/plan": answer(json.dumps({"error": ESCAPES}).encode(), status=400)}, {}


def _work_bomb(side_reps: int, window: int,
               declared_flops: int | None = None) -> Callable[[Stage, str], Routes]:
    """A case whose segment is :func:`~bench.micro.hostile_payloads.work_bomb` (``declared_flops``:
    the head FLOPs its plan declares instead of the model card's)."""

    def routes(s: Stage, rt: str) -> Routes:
        data = work_bomb(s.segment_metadata[rt], side_reps, window)
        digest = hashlib.sha256(data).hexdigest()
        url = f"/v1/segments/{digest}"
        plan = _segment_with(s.plans[rt], id=digest, url=url, size_bytes=len(data), sha256=digest)
        if declared_flops is not None:
            plan["head_flops"] = declared_flops
        return {"/v1/plan": s.plan_route(plan), url: answer(data, headers={"ETag": f'"{digest}"'})}, {}

    return routes


CASES: dict[str, Case] = {c.name: c for c in [
    Case("benign", "a normal run: plan, segment (cut 5), head, upload", _benign, fails=False,
         nothing_kept=False),
    Case("foreign_infer_url", "the plan's infer_url on another origin", _foreign_infer),
    Case("foreign_segment_url", "the plan's segment.url on another origin", _foreign_segment),
    Case("gzip_bomb_plan", "a 1.5 MB gzip plan answer that decodes to 1.5 GiB", _gzip_bomb),
    Case("endless_plan", "a plan answer that never ends (64 KiB pieces, no length)", _endless_plan),
    Case("huge_segment", "a plan announcing a 50 GiB segment, served endlessly", _huge_segment),
    Case("endless_segment", "the segment's bytes, then zeros without end", _endless_segment),
    Case("segment_cut_off", "half the segment, then the connection closes (kept to resume)",
         _segment_cut_off, nothing_kept=False),
    Case("drip_plan", "the plan answer, then a byte every 2 s", _drip_plan, settings=DRIP),
    Case("drip_segment", "the segment a byte every 2 s", _drip_segment, settings=DRIP),
    Case("drip_answer", "the tail's answer a byte every 2 s (the good segment stays cached)",
         _drip_answer, nothing_kept=False, settings=DRIP),
    Case("brotli_bomb_plan", "a plan answer in brotli that decodes to 512 MiB", _brotli_plan),
    Case("stacked_codings_plan", "the gzip bomb gzipped again, Content-Encoding 'gzip, gzip'",
         _stacked_plan),
    Case("head_drip_plan", "a status line, then the plan's headers a byte every 2 s", _head_drip_plan,
         settings=DRIP),
    Case("head_drip_segment", "the segment's headers a byte every 2 s", _head_drip_segment,
         settings=DRIP),
    Case("busy_forever", "503 with Retry-After 9 s on every plan request (5 retries)", _busy_forever,
         settings=DRIP),
    Case("escaped_labels", "card labels with OSC, CSI, CR, LF, C1, bidi", _escaped_labels, fails=False,
         nothing_kept=False),
    Case("escaped_error", "a 400 whose error string holds the same escapes", _escaped_error),
    Case("work_bomb", "a 1 KB ONNX segment of about 1e13 operations a sample", _work_bomb(2, 1792),
         runs_head=True),
    Case("work_bomb_at_cap", "a plan that declares 1e15 head FLOPs, its segment 1.6e10 operations (just "
         "under QPART_DEVICE_HEAD_MAX_FLOPS)", _work_bomb(1, 74, declared_flops=10**15), runs_head=True),
]}


def stage(server: str, origin: Origin, foreign: Origin, folder: Path,
          artifacts: Path = REPO / "artifacts") -> Stage:
    """The real server's answers for a normal run at :data:`CUT` in each runtime (``artifacts``:
    what it serves, for the cut's declared head FLOPs), and the payloads."""
    card = json.loads((artifacts / MODEL / "artifact.json").read_text())
    with httpx.Client(base_url=server, timeout=60) as c:
        metadata = c.get(f"/v2/models/{MODEL}").json()
        plans, segments, bombs = {}, {}, {}
        for rt in RUNTIMES:
            base = c.post("/v1/plan", json={"model": MODEL, "accuracy_demand": LEVEL, "rate_bps": 1e8,
                                            "runtime": rt}).json()
            info = c.get(f"/v1/models/{MODEL}", params={"runtime": rt}).json()
            p = next(p for p in info["patterns"] if p["cut"] == CUT and p["level"] == LEVEL)
            plans[rt] = {**base, "plan_id": f"{MODEL}@{info['version']}/{p['pattern_id']}",
                         **{k: p[k] for k in ("cut", "cut_node", "level", "weight_bits", "activation_bits",
                                              "group_size", "infer_url", "upload_batch")},
                         "activation_shape": activation_shape(MODEL, CUT), "segment": p["segment"],
                         "head_flops": card["cuts"][CUT]["head_flops"]}
            segments[rt] = c.get(p["segment"]["url"]).content
            bombs[rt] = {"model": MODEL, "version": info["version"], "cut": str(CUT),
                         "pattern_id": p["pattern_id"]}
    return Stage(origin, foreign, metadata, plans, segments, idx_file(folder / "one.idx"),
                 gzip_bomb(json.dumps(plans["torch"]).encode()), brotli_bomb(), bombs)
