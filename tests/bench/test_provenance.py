"""bench.write_json records which code wrote a result; bench.cpu_ticks how much CPU the host stole."""

from __future__ import annotations

import json
import subprocess

from bench import REPO, cpu_ticks, steal_fraction, write_json


def test_a_result_names_its_commit(tmp_path):
    write_json(tmp_path / "out" / "r.json", {"cells": [1]})
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    assert doc["cells"] == [1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert doc["provenance"]["commit"] == head.stdout.strip()
    assert isinstance(doc["provenance"]["tracked_files_changed"], bool)
    assert doc["provenance"]["written_at"].endswith("Z")
    start = doc["provenance"]["at_start"]  # as it was when this process first imported bench
    assert start["commit"] == head.stdout.strip() and start["written_at"] <= doc["provenance"]["written_at"]


def test_cpu_steal_is_read_from_the_cpu_line_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 5 0\ncpu0 50 0 25 400 5 0 0 20 0 0\n")
    assert cpu_ticks(stat) == (40, 1000)  # guest (5) is inside user already
    assert steal_fraction((40, 1000), (70, 1200)) == 0.15
    assert steal_fraction(None, (70, 1200)) is None
    assert steal_fraction((40, 1000), (40, 1000)) is None  # no time passed


def test_without_a_usable_proc_stat_steal_is_unknown(tmp_path):
    assert cpu_ticks(tmp_path / "missing") is None
    (tmp_path / "old").write_text("cpu  1 2 3 4\n")  # a kernel that counts no steal
    assert cpu_ticks(tmp_path / "old") is None
    (tmp_path / "odd").write_text("intr 1 2 3 4 5 6 7 8 9\n")
    assert cpu_ticks(tmp_path / "odd") is None
