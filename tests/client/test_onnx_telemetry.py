"""ONNX Runtime's own telemetry stays off wherever this product loads it (the ONNX device, the
calibration's runtime check): from 1.29 it reports to Microsoft from Linux too and writes a session
file (``.ses``, in $TMPDIR) unless ``ORT_DISABLE_TELEMETRY`` is set before it loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from tests.conftest import REPO

LOADERS = {
    "device": "import qpart.client.onnx_runtime",
    "calibration": ("import torch; from qpart.models.runtimes import runtime_refusals; "
                    "conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3)); "
                    "assert runtime_refusals(conv, (1, 8, 8)) == {}"),
}
REPORTS = tuple(int(v) for v in onnxruntime.__version__.split(".")[:2]) >= (1, 29)
CI_MARKERS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
              "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER",
              "ORT_RUNNING_UNIT_TESTS")
"""Variables under which ONNX Runtime keeps its telemetry quiet by itself (names in its library's
strings): left out of the runs below, so that they run as on a user's machine."""


def _run(code: str, root: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``code`` run where ``root/cwd`` is the working folder and ``root/tmp`` is $TMPDIR, with what it
    left in either."""
    (root / "cwd").mkdir()
    (root / "tmp").mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", *CI_MARKERS)}
    script = f"{code}; import os, onnxruntime; print(os.environ.get('ORT_DISABLE_TELEMETRY'))"
    done = subprocess.run([sys.executable, "-c", script], cwd=root / "cwd", capture_output=True, text=True,
                          env={**clean, "PYTHONPATH": str(REPO), "TMPDIR": str(root / "tmp"), **env},
                          timeout=120, check=False)
    return done, sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("where", sorted(LOADERS))
def test_loading_onnx_runtime_through_the_product_leaves_no_session_file(tmp_path, where):
    done, left = _run(LOADERS[where], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"] and left == []


@pytest.mark.skipif(not REPORTS, reason=f"onnxruntime {onnxruntime.__version__} predates its POSIX telemetry")
def test_the_session_file_is_what_onnx_runtime_writes_left_alone_and_a_user_may_let_it(tmp_path):
    # the check above can fail: ONNX Runtime loaded bare writes its session file into $TMPDIR
    (tmp_path / "bare").mkdir()
    assert _run("pass", tmp_path / "bare")[1] == ["tmp/.ses"]
    (tmp_path / "allowed").mkdir()
    done, left = _run(LOADERS["device"], tmp_path / "allowed", ORT_DISABLE_TELEMETRY="0")
    assert done.stdout.split() == ["0"] and left == ["tmp/.ses"]
