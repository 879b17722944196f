"""bench.write_json records which code wrote a result."""

from __future__ import annotations

import json
import subprocess

from bench import REPO, write_json


def test_a_result_names_its_commit(tmp_path):
    write_json(tmp_path / "out" / "r.json", {"cells": [1]})
    doc = json.loads((tmp_path / "out" / "r.json").read_text())
    assert doc["cells"] == [1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert doc["provenance"]["commit"] == head.stdout.strip()
    assert isinstance(doc["provenance"]["tracked_files_changed"], bool)
    assert doc["provenance"]["written_at"].endswith("Z")
