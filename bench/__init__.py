"""Benchmarks and baselines: they report numbers and never gate CI on time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, doc: dict[str, Any], indent: int = 1) -> None:
    """Write a benchmark's JSON document (creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")
