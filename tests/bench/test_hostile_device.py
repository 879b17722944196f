"""bench.micro.hostile_device: the torch and the ONNX device stay within the stated bounds against
a hostile server (issue 52, acceptance item 2), on one case per bound; and the watch that measures
them reads a child's own memory and stops one that has no bounds."""

from __future__ import annotations

import gzip
import sys

import pytest

from bench.harness.hostile_origin import Origin
from bench.harness.watched_process import Limits, run_watched
from bench.micro.hostile_cases import CASES, RUNTIMES, stage
from bench.micro.hostile_device import RSS_BOUND_BYTES, Idle, run_case, violations
from bench.micro.hostile_payloads import gzip_bomb

QUICK = ["foreign_segment_url", "gzip_bomb_plan", "huge_segment", "drip_plan"]
"""One case per bound, each of which the device at 4466f46 broke when the benchmark ran it
(``--device-path`` a worktree there): the token sent to another origin; 1.5 GiB over its idle RSS
and 1 GiB of .part on disk, each until the watch stopped it; a dripping plan read until the watch
stopped it, past the deadline."""


@pytest.fixture(scope="module")
def staged(server, tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile-device")
    with Origin(upstream=server.url) as origin, Origin(upstream=server.url) as foreign:
        yield stage(server.url, origin, foreign, work), work


@pytest.fixture(scope="module")
def idle(staged):
    st, work = staged
    figures = {}
    for runtime in RUNTIMES:
        run = run_case(CASES["benign"], runtime, st, None, work)
        assert run["returncode"] == 0 and run["violations"] == [], run
        assert run["outcome"].startswith("predictions: ")
        figures[runtime] = Idle(run["peak_rss_bytes"], run["wall_s"])
    return figures


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", QUICK)
def test_the_device_stays_within_every_bound_against(staged, idle, name, runtime):
    st, work = staged
    run = run_case(CASES[name], runtime, st, idle[runtime], work)
    assert run["violations"] == [], run
    assert run["outcome"].startswith("error: ")
    assert run["other_origin"]["with_authorization"] == 0 and run["bytes_left"] == 0


def _run(**changes):
    base = {"killed": None, "rss_over_idle_bytes": 0, "wall_s": 1.0, "deadline_s": 10.0,
            "other_origin": {"requests": 0, "with_authorization": 0, "with_body": 0}, "bytes_left": 0,
            "files_left": [], "one_error_line": True, "returncode": 2, "raw_control_chars": False}
    return {**base, **changes}


def test_each_bound_is_a_violation_when_broken():
    case = CASES["huge_segment"]
    assert violations(case, _run()) == []
    broken = [_run(rss_over_idle_bytes=RSS_BOUND_BYTES + 1), _run(wall_s=10.5),
              _run(other_origin={"requests": 1, "with_authorization": 1, "with_body": 0}),
              _run(other_origin={"requests": 1, "with_authorization": 0, "with_body": 1}),
              _run(bytes_left=12, files_left=["x.part"]), _run(one_error_line=False),
              _run(raw_control_chars=True), _run(killed="disk")]
    assert all(len(violations(case, run)) >= 1 for run in broken)
    assert violations(CASES["segment_cut_off"], _run(bytes_left=12, files_left=["x.part"])) == []


def test_the_watch_reads_the_childs_own_peak_not_the_parents(tmp_path):
    ballast = bytearray(400 << 20)  # the parent's RSS, which ru_maxrss would report for the child
    ballast[::4096] = b"\1" * len(ballast[::4096])
    code = "import time; x = bytearray(200 << 20); x[::4096] = b'1' * len(x[::4096]); time.sleep(0.3)"
    run = run_watched([sys.executable, "-c", code], {}, tmp_path / "none", Limits(60, 4 << 30, 1 << 30),
                      tmp_path / "out")
    assert run.returncode == 0 and run.killed is None
    assert 200 << 20 < run.peak_rss_bytes < 300 << 20
    del ballast


def test_the_watch_stops_a_child_at_its_memory_and_disk_limits(tmp_path):
    grow = "x = []\nwhile True: x.append(bytearray(1 << 20)); x[-1][::4096] = b'1' * 256"
    run = run_watched([sys.executable, "-c", grow], {}, tmp_path / "none", Limits(60, 150 << 20, 1 << 30),
                      tmp_path / "a")
    assert run.killed == "rss" and run.returncode == -9 and run.peak_rss_bytes > 150 << 20
    folder = tmp_path / "disk"
    fill = f"f = open({str(folder / 'x.part')!r}, 'wb')\nwhile True: f.write(bytes(1 << 20)); f.flush()"
    folder.mkdir()
    run = run_watched([sys.executable, "-c", fill], {}, folder, Limits(60, 4 << 30, 8 << 20), tmp_path / "b")
    assert run.killed == "disk"


def test_the_gzip_bomb_is_small_and_decodes_to_its_stated_size():
    bomb = gzip_bomb(b'{"plan": 1}', mib=64)
    assert len(bomb) < 80_000
    decoded = gzip.decompress(bomb)
    assert len(decoded) == len(b'{"plan": 1}') + (64 << 20) and decoded.startswith(b'{"plan": 1}  ')
