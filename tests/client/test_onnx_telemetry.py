"""ONNX Runtime's own telemetry stays off wherever this product loads it (the ONNX device, the
calibration's runtime check): since 1.29 it reports to Microsoft from Linux too and writes a
session file into $TMPDIR unless ``ORT_DISABLE_TELEMETRY`` is set before it loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

LOADERS = {
    "device": "import qpart.client.onnx_runtime",
    "calibration": ("import torch; from qpart.models.runtimes import runtime_refusals; "
                    "conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3)); "
                    "assert runtime_refusals(conv, (1, 8, 8)) == {}"),
}


def _run(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    script = f"{code}; import os, onnxruntime; print(os.environ.get('ORT_DISABLE_TELEMETRY'))"
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**clean, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), **env},
                          timeout=120, check=False)


@pytest.mark.parametrize("where", sorted(LOADERS))
def test_loading_onnx_runtime_through_the_product_leaves_no_session_file(tmp_path, where):
    done = _run(LOADERS[where], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]
    assert list(tmp_path.iterdir()) == []


def test_the_session_file_is_what_onnx_runtime_writes_left_alone_and_a_user_may_let_it(tmp_path):
    # the check above can fail: ONNX Runtime loaded bare writes its session file where it runs
    bare = tmp_path / "bare"
    bare.mkdir()
    assert _run("pass", bare).returncode == 0
    assert [p.name for p in bare.iterdir()] == [".ses"]
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    done = _run(LOADERS["device"], allowed, ORT_DISABLE_TELEMETRY="0")
    assert done.stdout.split() == ["0"] and [p.name for p in allowed.iterdir()] == [".ses"]
