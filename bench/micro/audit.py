"""What live audits cost the answers (issue 50, acceptance 2): tail throughput and p99 at 32 clients
with ``QPART_AUDIT_RATE=0.05`` against 0, in one run.

``python -m bench.micro.audit [--json PATH] [--seconds S] [--rounds R] [--clients C] [--rate P]``

Two servers run side by side, pinned to core 0 as :mod:`bench.micro.serve` runs them (batching on,
one torch thread): one with ``QPART_AUDIT_RATE=P`` (default 0.05), one with 0. wrk on core 1 drives
the answers: ``C`` clients POST a real activation packet of fmnist-cnn's all-server plan back to
back. Beside wrk, on the audited server only, a sender thread brings what P of those answers would
bring: one audit upload (the raw input, a float32 packet) per 1/P answers, paced at P times the
answers per second the warm-up run measured, each for an audit prepared before the rounds (a
consenting plan the server marked at its rate, and that plan's tail request with ``Qpart-Audit``,
so the upload is taken and queued for the float model). Rounds alternate which server goes first.
Both servers are scraped once a second while under load, as Prometheus would. Reported per round:
answers/s and p99 of each, their ratio, the uploads taken and dropped (the server's
``qpart_audit_dropped_total``), the audits checked, and the deepest audit queue the scrapes saw
(within ``QPART_AUDIT_QUEUE``). The noise is the baseline's own spread over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench import REPO, free_port, write_json
from bench.harness.loadgen import Server, require_wrk, start_server, wrk

MODEL = "fmnist-cnn"
QUEUE = 64  # QPART_AUDIT_QUEUE's default


def _start(artifacts: Path, rate: float) -> Server:
    port = free_port()
    env = {"QPART_PORT": str(port), "QPART_MAX_BATCH_SIZE": "32", "QPART_TORCH_THREADS": "1",
           "QPART_MAX_QUEUE": "4096", "QPART_AUDIT_RATE": str(rate), "QPART_AUDIT_TTL_S": "3600",
           "QPART_AUDIT_OPEN_MAX": "100000", "QPART_AUDIT_QUEUE": str(QUEUE)}
    cmd = [sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts)]
    return start_server(cmd, f"http://127.0.0.1:{port}", "/v2/health/ready", env)


def _images(n: int) -> np.ndarray:
    from qpart.models.data import Split, load_split

    return load_split(Split.TEST, limit=n).images.astype(np.float32)


def _plan_body() -> dict[str, Any]:
    return {"model": MODEL, "accuracy_demand": 0.01, "rate_bps": 1e6, "device": "raspberry-pi-4",
            "audit": True}


def _target(server: Server) -> tuple[str, bytes]:
    """The all-server plan's infer URL and a real packet (the answers wrk asks for)."""
    from qpart.client.plans import PlanResponse
    from qpart.client.runtime import encode_for_plan

    plan = httpx.post(f"{server.url}/v1/plan", json={**_plan_body(), "audit": False}, timeout=30).json()
    if plan["cut"] != 0:
        raise RuntimeError(f"expected the all-server cut, got {plan['cut']}")
    return f"{server.url}{plan['infer_url']}", encode_for_plan(_images(1), PlanResponse.model_validate(plan))


def prepare_audits(server: Server, wanted: int) -> list[tuple[str, bytes]]:
    """``wanted`` audits the server marked at its own rate, each answered: (upload URL, raw input)."""
    from qpart.client.plans import PlanResponse
    from qpart.client.runtime import encode_for_plan
    from qpart.kernels.wire import encode_float_activation

    images, plans = _images(256), 0
    ready: list[tuple[str, bytes]] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while len(ready) < wanted:
            plan = client.post("/v1/plan", json=_plan_body()).json()
            plans += 1
            if plan["audit"] is None:
                continue
            x = images[len(ready) % len(images)][None]
            packet = encode_for_plan(x, PlanResponse.model_validate(plan))
            answer = client.post(plan["infer_url"], content=packet,
                                 headers={"Qpart-Audit": plan["audit"]["id"]})
            answer.raise_for_status()
            ready.append((plan["audit"]["url"], encode_float_activation(x)))
    print(f"prepared {wanted} audits from {plans} consenting plans", file=sys.stderr)
    return ready


def _audit_counts(server: Server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    counts = {"checked": 0.0, "dropped": 0.0, "queue_depth": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "qpart_audit_samples_total":
                counts["checked"] += s.value
            elif s.name == "qpart_audit_dropped_total":
                counts["dropped"] += s.value
            elif s.name == "qpart_audit_queue_depth":
                counts["queue_depth"] = s.value
    return counts


class Scraper(threading.Thread):
    """Scrapes a server's /metrics every ``every_s`` while it is under load, as Prometheus would (both
    servers alike), and keeps the deepest audit queue it saw."""

    def __init__(self, server: Server, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.server, self.every_s = server, every_s
        self.stop = threading.Event()
        self.deepest = 0.0

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.deepest = max(self.deepest, _audit_counts(self.server)["queue_depth"])


def _scraped(server: Server, load: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], float]:
    """``load()`` with the server scraped meanwhile; its result and the deepest audit queue seen."""
    scraper = Scraper(server)
    scraper.start()
    try:
        return load(), scraper.deepest
    finally:
        scraper.stop.set()
        scraper.join(10)


class Sender(threading.Thread):
    """Uploads audits at ``per_s`` until stopped; records what the server said."""

    def __init__(self, server: Server, audits: list[tuple[str, bytes]], per_s: float) -> None:
        super().__init__(daemon=True)
        self.server, self.audits, self.per_s = server, audits, per_s
        self.stop = threading.Event()
        self.taken = self.not_queued = self.refused = self.used = 0
        self.ran_out = False

    def run(self) -> None:
        started = time.perf_counter()
        with httpx.Client(base_url=self.server.url, timeout=30) as client:
            for sent, (url, body) in enumerate(self.audits):
                wait = started + sent / self.per_s - time.perf_counter()
                if self.stop.wait(max(0.0, wait)):
                    return
                self.used += 1
                answer = client.post(url, content=body)
                if answer.status_code != 202:
                    self.refused += 1
                    continue
                self.taken += 1
                self.not_queued += not answer.json()["queued"]
        self.ran_out = True


def _answers(server: Server, target: tuple[str, bytes], clients: int, seconds: int) -> dict[str, Any]:
    url, body = target
    result, deepest = _scraped(server, lambda: wrk(url, body, "application/octet-stream", clients, seconds))
    result["deepest_queue"] = deepest
    return result


def _audited_run(server: Server, target: tuple[str, bytes], clients: int, seconds: int,
                 audits: list[tuple[str, bytes]], per_s: float) -> dict[str, Any]:
    before = _audit_counts(server)
    sender = Sender(server, audits, per_s)
    sender.start()
    result = _answers(server, target, clients, seconds)
    sender.stop.set()
    sender.join(30)
    time.sleep(1.0)  # the worker finishes what was queued
    after = _audit_counts(server)
    if sender.ran_out:
        raise RuntimeError("the sender ran out of prepared audits: prepare more")
    del audits[: sender.used]  # each audit is uploaded once
    result.update(uploads_taken=sender.taken, uploads_not_queued=sender.not_queued,
                  uploads_refused=sender.refused,
                  checked=after["checked"] - before["checked"], dropped=after["dropped"] - before["dropped"],
                  uploads_per_answer=sender.taken / max(1, result["requests"]))
    return result


def run(artifacts: Path, seconds: int, rounds: int, clients: int, rate: float) -> dict[str, Any]:
    """Both servers, warm-up, then ``rounds`` interleaved runs; the summary document."""
    require_wrk()
    base, audited = _start(artifacts, 0.0), _start(artifacts, rate)
    try:
        base_target, audit_target = _target(base), _target(audited)
        warm = _answers(base, base_target, clients, seconds)
        _answers(audited, audit_target, clients, seconds)
        per_s = rate * warm["throughput_rps"]
        audits = prepare_audits(audited, int(per_s * seconds * rounds * 1.5) + 10)
        runs = []
        for r in range(rounds):
            order = ("base", "audited") if r % 2 == 0 else ("audited", "base")
            row: dict[str, Any] = {"round": r + 1, "order": list(order)}
            for arm in order:
                row[arm] = (_answers(base, base_target, clients, seconds) if arm == "base" else
                            _audited_run(audited, audit_target, clients, seconds, audits, per_s))
            row["throughput_ratio"] = row["audited"]["throughput_rps"] / row["base"]["throughput_rps"]
            row["p99_ratio"] = row["audited"]["p99_s"] / row["base"]["p99_s"]
            runs.append(row)
            print(f"round {r + 1}: ratio {row['throughput_ratio']:.3f}, p99 {row['p99_ratio']:.3f}, "
                  f"uploads {row['audited']['uploads_taken']}, dropped {row['audited']['dropped']:.0f}",
                  file=sys.stderr)
    finally:
        for server in (base, audited):
            server.proc.terminate()
            server.proc.wait(30)
    base_p99 = [r["base"]["p99_s"] for r in runs]
    return {
        "model": MODEL, "clients": clients, "audit_rate": rate, "seconds": seconds, "rounds": rounds,
        "uploads_per_s": per_s, "audit_queue": QUEUE, "runs": runs,
        "throughput_ratio": {"median": statistics.median(r["throughput_ratio"] for r in runs),
                             "per_round": [r["throughput_ratio"] for r in runs]},
        "p99_ratio": {"median": statistics.median(r["p99_ratio"] for r in runs),
                      "per_round": [r["p99_ratio"] for r in runs]},
        "base_p99_spread": max(base_p99) / min(base_p99),
        "deepest_audit_queue": max(r["audited"]["deepest_queue"] for r in runs),
        "dropped": sum(r["audited"]["dropped"] for r in runs),
        "checked": sum(r["audited"]["checked"] for r in runs),
    }


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=int, default=8, help="duration of each load run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0.05, help="QPART_AUDIT_RATE of the audited server")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    doc = run(args.artifacts, args.seconds, args.rounds, args.clients, args.rate)
    t, p = doc["throughput_ratio"], doc["p99_ratio"]
    rounds = ", ".join(f"{v:.3f}" for v in t["per_round"])
    print(f"audited / not, at {doc['clients']} clients, rate {doc['audit_rate']}: throughput "
          f"{t['median']:.3f} (rounds {rounds}), p99 {p['median']:.3f} "
          f"(rounds {', '.join(f'{v:.3f}' for v in p['per_round'])}; the baseline's own p99 spread "
          f"{doc['base_p99_spread']:.3f}x); {doc['checked']:.0f} audited samples checked, "
          f"{doc['dropped']:.0f} "
          f"dropped, deepest audit queue {doc['deepest_audit_queue']:.0f} of {doc['audit_queue']}")
    if args.json:
        write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
