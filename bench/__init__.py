"""Benchmarks and baselines: they report numbers and never gate CI on time."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def provenance() -> dict[str, Any]:
    """The commit the benchmark ran at, whether tracked files differed from it, and when: a result
    file then says which code produced it (``commit`` is None outside a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                                  check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "tracked_files_changed": bool(changed) if changed is not None else None,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(path: Path, doc: dict[str, Any], indent: int = 1) -> None:
    """Write a benchmark's JSON document (creating its folder), with its :func:`provenance`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, "provenance": provenance()}, indent=indent) + "\n")
