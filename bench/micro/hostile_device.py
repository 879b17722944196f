"""The device under a hostile server (issue 52, acceptance item 2): ``qpart device infer`` of the
torch and the ONNX device, one process a run, against one hostile answer at a time, measured
against stated bounds.

``python -m bench.micro.hostile_device --json bench/results/hostile_device.json [--cases A,B]
[--device-path DIR]`` (``--device-path``: run an older checkout's device, e.g. a worktree at
4466f46, with ``PYTHONPATH=DIR``; its idle figures are its own benign run's)

A real ``qpart serve`` (the committed fmnist-cnn artifact) answers behind a loopback origin
(:class:`bench.harness.hostile_origin.Origin`) that the device is pointed at; a second origin stands
for another host that a plan may name, and records what reaches it. The origin's plan is the real
server's pattern at cut 1 (level 1%) for the device's runtime, so a normal run plans, downloads a
segment, runs a head and uploads: that is the benign case, whose peak RSS and wall time are the
device's idle figures. Every other case changes one answer
(:data:`bench.micro.hostile_cases.CASES`).

Bounds (:func:`violations`; ``tests/bench/test_hostile_device.py`` asserts them on a few cases):

- peak RSS at most :data:`RSS_BOUND_BYTES` above the benign run's, same runtime;
- wall time at most the benign run's plus one transfer's bound (each case attacks one transfer;
  the bound is per transfer, ADR 0020: ``transfer_deadline_s``
  plus ``timeout_s`` plus the segment's announced size at ``transfer_min_rate_bps``), plus the ONNX
  head's run deadline where the device has one, plus :data:`SLACK_S`;
- no request on the other origin carries ``Authorization`` or a body;
- no byte on disk in the cache folder after a case the device refuses (its download failed or
  never started); a lost connection's ``.part``, kept to resume, is no refusal (``segment_cut_off``);
- an expected refusal is one ``error: …`` line with exit status 2; nothing printed holds a raw
  control character.

Settings are the defaults except the cache folder (a fresh one a run) and the token (set, so that a
leak would show); the three drip cases shrink ``transfer_deadline_s`` to 5 s and ``timeout_s`` to
3 s, with a byte every 2 s (under the read timeout: only the overall deadline can end it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO, free_port, start_server, write_json
from bench.harness.hostile_origin import Origin
from bench.harness.watched_process import Limits, folder_bytes, run_watched
from bench.micro.hostile_cases import CASES, CUT, LEVEL, MODEL, RUNTIMES, Case, Stage, stage
from qpart.client.settings import DeviceSettings

TOKEN = "bench-secret-token"
RSS_BOUND_BYTES = 1 << 30
"""The stated memory bound: peak RSS at most this far above the benign run's."""
SLACK_S = 10.0
"""Added to every run's deadline: process start and scheduling on a busy 2-core machine."""
KILL_AFTER_S = 15.0
"""The watch kills a run this long after its deadline (so an unbounded device is measured)."""
DISK_KILL_BYTES = 1 << 30
"""The watch kills a run whose cache folder holds more (a device filling the disk)."""


@dataclass(frozen=True)
class Idle:
    """The benign run of one runtime: what every case of that runtime is compared with."""

    peak_rss_bytes: int
    wall_s: float


def deadline_s(case: Case, rt: str, st: Stage, idle: Idle) -> float:
    """The stated deadline of ``case``: the benign run, one transfer's bound under the case's
    settings (ADR 0020), the ONNX head's run deadline where its segment may run, and :data:`SLACK_S`."""
    settings = DeviceSettings(**case.settings)  # type: ignore[arg-type]
    segment_bytes = st.plans[rt]["segment"]["size_bytes"]
    transfer = (settings.transfer_deadline_s + settings.timeout_s
                + segment_bytes * 8 / settings.transfer_min_rate_bps)
    head = _head_bound_s(settings) if case.runs_head and rt == "onnx" else 0.0
    return float(idle.wall_s + transfer + head + SLACK_S)


def _head_bound_s(settings: DeviceSettings) -> float:
    """The longest an ONNX head run of one sample may take: its fixed deadline plus the largest
    work budget at the slowest rate."""
    return settings.head_deadline_s + settings.head_max_flops / settings.head_min_flops_per_s


def _device_env(origin: str, cache: Path, settings: dict[str, float],
                device_path: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QPART_")}
    env |= {"QPART_DEVICE_SERVER": origin, "QPART_DEVICE_TOKEN": TOKEN, "QPART_DEVICE_CACHE_DIR": str(cache)}
    env |= {f"QPART_DEVICE_{name.upper()}": str(value) for name, value in settings.items()}
    if device_path is not None:
        env["PYTHONPATH"] = str(device_path)
    return env


def _raw_controls(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch not in "\n\t" for ch in text)


def run_case(case: Case, rt: str, st: Stage, idle: Idle | None, work: Path,
             device_path: Path | None = None) -> dict[str, Any]:
    """One run of ``qpart device infer --runtime rt`` against ``case``, watched and measured
    (``idle``: the benign run of ``rt``; None for the benign run itself)."""
    origin_routes, foreign_routes = case.routes(st, rt)
    st.origin.reset(origin_routes)
    st.foreign.reset(foreign_routes)
    folder = work / f"{case.name}-{rt}"
    cache = folder / "cache"
    deadline = deadline_s(case, rt, st, idle) if idle else None
    limits = Limits(wall_s=(deadline or 120.0) + KILL_AFTER_S,
                    rss_bytes=(idle.peak_rss_bytes if idle else 3 << 30) + RSS_BOUND_BYTES + (512 << 20),
                    disk_bytes=DISK_KILL_BYTES)
    command = [sys.executable, "-m", "qpart", "device", "infer", "--idx", str(st.idx), "--limit", "1",
               "--runtime", rt]
    env = _device_env(st.origin.url, cache, case.settings, device_path)
    w = run_watched(command, env, cache, limits, folder)
    lines = [line for line in (w.stderr + "\n" + w.stdout).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("error:", "predictions:"))]
    outcome = (f"killed by the watch ({w.killed} limit)" if w.killed
               else (said or lines or ["(nothing printed)"])[-1][:300])
    errors = [line for line in w.stderr.splitlines() if line.strip()]
    foreign = st.foreign.seen
    record: dict[str, Any] = {
        "case": case.name, "runtime": rt, "returncode": w.returncode, "outcome": outcome,
        "one_error_line": w.returncode == 2 and len(errors) == 1 and errors[0].startswith("error: "),
        "wall_s": round(w.wall_s, 3), "deadline_s": round(deadline, 3) if deadline else None,
        "killed": w.killed, "peak_rss_bytes": w.peak_rss_bytes,
        "rss_over_idle_bytes": w.peak_rss_bytes - idle.peak_rss_bytes if idle else 0,
        "other_origin": {"requests": len(foreign),
                         "with_authorization": sum(r.authorization for r in foreign),
                         "with_body": sum(r.body_bytes > 0 for r in foreign)},
        "bytes_left": folder_bytes(cache),
        "files_left": sorted(p.name for p in cache.rglob("*") if p.is_file()) if cache.is_dir() else [],
        "raw_control_chars": _raw_controls(w.stdout + w.stderr),
    }
    record["violations"] = violations(case, record)
    shutil.rmtree(folder, ignore_errors=True)
    return record


def violations(case: Case, r: dict[str, Any]) -> list[str]:
    """Each stated bound that run ``r`` of ``case`` broke (none: it held them all)."""
    out = []
    if r["killed"]:
        out.append(f"killed by the watch at its {r['killed']} limit")
    if r["rss_over_idle_bytes"] > RSS_BOUND_BYTES:
        out.append(f"peak RSS {r['rss_over_idle_bytes'] / 2**20:.0f} MiB over idle, "
                   f"bound {RSS_BOUND_BYTES >> 20} MiB")
    if r["deadline_s"] is not None and r["wall_s"] > r["deadline_s"]:
        out.append(f"ran {r['wall_s']:.1f} s, deadline {r['deadline_s']:.1f} s")
    if r["other_origin"]["with_authorization"] or r["other_origin"]["with_body"]:
        out.append(f"sent to the other origin: {r['other_origin']}")
    if case.nothing_kept and r["bytes_left"]:
        out.append(f"{r['bytes_left']} bytes left on disk ({', '.join(r['files_left'])})")
    if case.fails and not r["one_error_line"]:
        out.append("not one 'error:' line with exit status 2")
    if not case.fails and r["returncode"] != 0:
        out.append(f"exit status {r['returncode']}")
    if r["raw_control_chars"]:
        out.append("printed a raw control character")
    return out


def run_all(server: str, names: list[str], work: Path, device_path: Path | None = None) -> dict[str, Any]:
    """Every case of ``names`` in both runtimes, each runtime's benign run first."""
    with Origin(upstream=server) as origin, Origin(upstream=server) as foreign:
        st = stage(server, origin, foreign, work)
        idle: dict[str, Idle] = {}
        runs = []
        for rt in RUNTIMES:
            benign = run_case(CASES["benign"], rt, st, None, work, device_path)
            if benign["returncode"] != 0:
                raise RuntimeError(f"the benign {rt} run failed: {benign['outcome']}")
            idle[rt] = Idle(benign["peak_rss_bytes"], benign["wall_s"])
            runs.append(benign)
            for name in names:
                runs.append(run_case(CASES[name], rt, st, idle[rt], work, device_path))
                print(_row(runs[-1]), flush=True)
    return {"model": MODEL, "cut": CUT, "level": LEVEL, "token_set": True,
            "device": _device_of(device_path),
            "bounds": {"rss_over_idle_bytes": RSS_BOUND_BYTES, "slack_s": SLACK_S,
                       "deadline": "benign wall + transfer_deadline_s + timeout_s + segment bytes x 8 "
                                   "/ transfer_min_rate_bps (+ the ONNX head's run deadline for "
                                   "work_bomb) + slack_s"},
            "changed_settings": {"all": ["cache_dir (a fresh folder a run)", "token"],
                                 **{c.name: c.settings for c in CASES.values() if c.settings}},
            "cases": {c.name: c.what for c in CASES.values()},
            "idle": {rt: {"peak_rss_bytes": i.peak_rss_bytes, "wall_s": i.wall_s} for rt, i in idle.items()},
            "runs": runs}


def _device_of(device_path: Path | None) -> dict[str, Any]:
    """Which device ran: this checkout's (see ``provenance``), or the commit at ``device_path``."""
    if device_path is None:
        return {"path": None, "commit": None}
    done = subprocess.run(["git", "-C", str(device_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False)
    return {"path": str(device_path), "commit": done.stdout.strip() or None}


def _row(r: dict[str, Any]) -> str:
    from qpart.client.cli import terminal_text

    other = r["other_origin"]
    deadline = f"{r['deadline_s']:.1f}" if r["deadline_s"] else "-"
    verdict = "ok" if not r["violations"] else "; ".join(r["violations"])
    return (f"{r['case']:<20} {r['runtime']:<5} {terminal_text(r['outcome'])[:64]:<64} {r['wall_s']:>6.1f} "
            f"{deadline:>6} {r['rss_over_idle_bytes'] / 2**20:>+8.0f} {other['with_authorization']}/"
            f"{other['with_body']}/{other['requests']:<3} {r['bytes_left']:>10} {verdict}")


HEADER = (f"{'case':<20} {'rt':<5} {'outcome':<64} {'wall s':>6} {'limit':>6} {'RSS MiB':>8} "
          f"{'auth/body/req':<13} {'bytes left':>10} bounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--cases", default=",".join(n for n in CASES if n != "benign"),
                        help="comma-separated case names (the benign run always comes first)")
    parser.add_argument("--device-path", type=Path, help="PYTHONPATH of an older checkout's device")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the server below is stopped
    names = [n for n in args.cases.split(",") if n and n != "benign"]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="hostile-device-") as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "artifacts" / MODEL, work / "artifacts" / MODEL)
        port = free_port()
        server = start_server(port, artifacts=work / "artifacts")
        try:
            print(HEADER, flush=True)
            doc = run_all(f"http://127.0.0.1:{port}", names, work, args.device_path)
        finally:
            server.terminate()
            server.wait(30)
    broken = [r for r in doc["runs"] if r["violations"]]
    print(f"{len(doc['runs']) - len(broken)} of {len(doc['runs'])} runs within every bound; idle peak RSS "
          + ", ".join(f"{rt} {i['peak_rss_bytes'] / 2**20:.0f} MiB in {i['wall_s']:.1f} s"
                      for rt, i in doc["idle"].items()))
    if args.json:
        write_json(args.json, doc)


if __name__ == "__main__":
    main()
