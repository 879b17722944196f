"""schemathesis (its CLI, all checks) against a live server's OpenAPI document."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_generated_requests_find_no_5xx_and_no_schema_violation(cnn_only, tmp_path):
    from tests.conftest import LiveServer

    server = LiveServer(cnn_only)
    try:
        server.wait_ready()
        st = shutil.which("st") or str(Path(sys.executable).parent / "st")
        result = subprocess.run(
            [st, "run", f"{server.url}/openapi.json", "--max-examples", "60", "--seed", "1",
             "--checks", "all", "--continue-on-failure", "--request-timeout", "20"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    finally:
        server.stop()
    out = result.stdout + result.stderr
    match = re.search(r"(\d+) generated, (\d+) passed", out)
    assert match, out[-3000:]
    generated, passed = int(match.group(1)), int(match.group(2))
    assert generated >= 300
    assert passed == generated, out[-3000:]
    assert result.returncode == 0, out[-3000:]
