"""Packet timeline of small and large uploads on the shaped link: where an upload's time goes.

``python -m bench.e2e.analyses.uplink_trace --rate 100 [--rounds 50] [--json PATH]`` (root; needs tcpdump)

As :mod:`bench.e2e.analyses.uplink` (private network namespace, shaper, :meth:`ShapedLink.quiet` before each
request), the image is uploaded at cut 0 with the fewest bits and as float32, alternately, while
tcpdump records loopback. On an egress link tcpdump sees a packet as the shaper releases it. Per
request the trace gives when the headers' segment passed, when the body's last segment did, and
when the answer's first data segment left the server. If the server handled requests only once
the body was in, the answer would leave a fixed time after the body's end; when it starts on the
headers, part of a longer body's wire time is hidden, and the answer leaves a fixed time after
the headers instead. The planner's ``upload_overlap_s`` term prices that (ADR 0004); ``bench.e2e``
now fits an upload rate instead (ADR 0006).
"""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.e2e.analyses.uplink import PORT, WARMUP_ROUNDS, link_main, shaped_session


def _segments(lines: list[str]) -> list[tuple[float, str, int]]:
    """(time, "req" | "resp", payload bytes) of every data-carrying TCP segment to or from PORT."""
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or "length" not in fields:
            continue
        try:
            stamp, size = float(fields[0]), int(fields[-1])
        except ValueError:
            continue
        if size <= 0 or not math.isfinite(stamp):  # bare ACKs carry no data
            continue
        if fields[4] == f"127.0.0.1.{PORT}:":
            out.append((stamp, "req", size))
        elif fields[2] == f"127.0.0.1.{PORT}":
            out.append((stamp, "resp", size))
    return out


def timeline(segments: list[tuple[float, str, int]], start: float, end: float) -> dict[str, float] | None:
    """One request's milestones (seconds after its headers), or None if the trace misses some."""
    inside = [s for s in segments if start <= s[0] <= end]
    sent = [s[0] for s in inside if s[1] == "req"]
    answer = [s[0] for s in inside if s[1] == "resp"]
    if not sent or not answer:
        return None
    headers, body_end, first_answer = sent[0], sent[-1], answer[0]
    return {"body_end_after_headers_s": body_end - headers,
            "answer_after_body_end_s": first_answer - body_end,
            "answer_after_headers_s": first_answer - headers}


def run(rate_mbps: float, rounds: int, model: str, artifacts: Path) -> dict[str, Any]:
    """Timelines of the smallest and largest cut-0 uploads at ``rate_mbps``; the JSON document."""
    marks: list[tuple[int, float, float, float]] = []
    with (shaped_session(model, artifacts) as session,
          tempfile.TemporaryDirectory(prefix="qpart-trace-") as tmp):
        pcap = Path(tmp) / "trace.pcap"
        dump = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-w", str(pcap),
                                 "--time-stamp-precision=nano"], stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # tcpdump attached
            packets = session.packets
            chosen = [min(packets), max(packets)]
            session.wire.set_rate(rate_mbps)
            rng = random.Random(0)
            for i in range(rounds + WARMUP_ROUNDS):
                rng.shuffle(chosen)
                for bits in chosen:
                    url, _, packet = packets[bits]
                    session.wire.quiet()
                    wall, start = time.time(), time.perf_counter()
                    r = session.client.post(session.url + url, content=packet)
                    elapsed = time.perf_counter() - start
                    r.raise_for_status()
                    if i >= WARMUP_ROUNDS:
                        marks.append((bits, wall, elapsed, r.json()["compute_s"]))
        finally:
            time.sleep(0.5)
            dump.terminate()
            dump.wait()
        text = subprocess.run(["tcpdump", "-r", str(pcap), "-n", "-tt", "--time-stamp-precision=nano"],
                              capture_output=True, text=True, check=True).stdout.splitlines()
    segments = _segments(text)
    rows = []
    for bits in sorted({m[0] for m in marks}):
        lines = [t for b, wall, elapsed, _ in marks if b == bits
                 if (t := timeline(segments, wall, wall + elapsed)) is not None]
        row: dict[str, Any] = {"activation_bits": bits, "upload_bytes": len(packets[bits][2]),
                               "traced": len(lines),
                               "round_trip_median_s": statistics.median(m[2] for m in marks if m[0] == bits),
                               "compute_median_s": statistics.median(m[3] for m in marks if m[0] == bits)}
        for key in ("body_end_after_headers_s", "answer_after_body_end_s", "answer_after_headers_s"):
            row[key] = statistics.median(t[key] for t in lines) if lines else None
        rows.append(row)
    return {"rate_mbps": rate_mbps, "rounds": rounds, "model": model, "uploads": rows}


def _report(doc: dict[str, Any], rate_mbps: float) -> None:
    for r in doc["uploads"]:
        ms = {k: "n/a" if v is None else f"{v * 1e3:.3f}" for k, v in r.items() if k.endswith("_s")}
        print(f"{r['activation_bits']:2d} bits, {r['upload_bytes']:5d} B ({r['traced']} traced): body ends "
              f"{ms['body_end_after_headers_s']} ms after the headers; answer leaves "
              f"{ms['answer_after_body_end_s']} ms after the body's end, "
              f"{ms['answer_after_headers_s']} ms after the headers; round trip "
              f"{ms['round_trip_median_s']} ms (medians)")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (needs tcpdump: apt-get install tcpdump)."""
    link_main("bench.e2e.analyses.uplink_trace", __doc__, 50, run, _report, argv, tools=("tc", "tcpdump"))


if __name__ == "__main__":
    main()
