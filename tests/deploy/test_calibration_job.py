"""The calibration Job's script and the KubeRay RayJob's entrypoint, run by a real /bin/sh from
each state a killed pod can leave on its volume: they resume, never recalibrate what is finished,
and never leave the servers without a whole artifact folder. ``qpart`` is a stand-in that records
its arguments and writes what the real one writes (the job itself: ``tests/offline/test_checkpoint.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import one, render

FAKE_QPART = """#!/bin/sh
echo "$@" >> "$CALLS"
out=""
while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
ls "$out/checkpoint" > "$(dirname "$CALLS")/seen" 2>/dev/null || true
mkdir -p "$out"; echo '{"model": "new"}' > "$out/artifact.json"; rm -rf "$out/checkpoint"
"""


@pytest.fixture(scope="module", params=["Job", "RayJob"])
def script(request) -> str:
    """The plain Job's script, and the KubeRay RayJob's entrypoint (the same, through Ray)."""
    if request.param == "Job":
        job = one(render("overlays/single-node"), "Job")
        return job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    return one(render("kuberay"), "RayJob")["spec"]["entrypoint"]


def run(script: str, root: Path, **env: str) -> tuple[int, list[str]]:
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "qpart").write_text(FAKE_QPART)
    (bin_dir / "qpart").chmod(0o755)
    calls = root / "calls"
    calls.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), **env}
    done = subprocess.run(["/bin/sh", "-c", script.replace("/out/", f"{root}/out/")], check=False, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.returncode, calls.read_text().splitlines()


def put(folder: Path, model: str, checkpoint: bool = False) -> None:
    folder.mkdir(parents=True)
    (folder / "artifact.json").write_text(f'{{"model": "{model}"}}\n')
    if checkpoint:
        (folder / "checkpoint").mkdir()


def live(root: Path) -> str:
    return (root / "out/models/fmnist-cnn/artifact.json").read_text().strip()


def test_a_first_run_calibrates_into_the_live_folder(script, tmp_path):
    _, calls = run(script, tmp_path)
    assert len(calls) == 1
    assert calls[0].startswith(f"calibrate --model fmnist-cnn --out {tmp_path}/out/staging/fmnist-cnn.tmp")
    assert live(tmp_path) == '{"model": "new"}'
    assert sorted(p.name for p in (tmp_path / "out/staging").iterdir()) == []


def test_a_pod_killed_mid_calibration_resumes_from_its_checkpoints(script, tmp_path):
    put(tmp_path / "out/models/fmnist-cnn", "old")
    (tmp_path / "out/staging/fmnist-cnn.tmp/checkpoint").mkdir(parents=True)
    _, calls = run(script, tmp_path)
    assert len(calls) == 1 and "--fresh" not in calls[0]
    assert live(tmp_path) == '{"model": "new"}'


def test_a_pod_killed_after_calibrating_does_not_calibrate_again(script, tmp_path):
    put(tmp_path / "out/models/fmnist-cnn", "old")
    put(tmp_path / "out/staging/fmnist-cnn.tmp", "done")
    _, calls = run(script, tmp_path)
    assert calls == [] and live(tmp_path) == '{"model": "done"}'


def test_a_pod_killed_between_the_two_renames_finishes_the_swap(script, tmp_path):
    put(tmp_path / "out/staging/fmnist-cnn.old", "old")  # live moved aside, the new one not yet in
    put(tmp_path / "out/staging/fmnist-cnn.tmp", "done")
    _, calls = run(script, tmp_path)
    assert calls == [] and live(tmp_path) == '{"model": "done"}'
    assert not (tmp_path / "out/staging/fmnist-cnn.old").exists()


def test_a_pod_killed_after_the_swap_only_tidies_up(script, tmp_path):
    put(tmp_path / "out/models/fmnist-cnn", "done")
    put(tmp_path / "out/staging/fmnist-cnn.old", "old")
    _, calls = run(script, tmp_path)
    assert calls == [] and live(tmp_path) == '{"model": "done"}'
    assert not (tmp_path / "out/staging/fmnist-cnn.old").exists()


def test_fresh_in_the_env_discards_the_checkpoints_once_per_token(script, tmp_path):
    """A new FRESH token discards what staging holds before calibrating; a retry of the same Job
    (the same token) resumes its checkpoints (review of issue 26: FRESH=1 passed --fresh to every
    retry, so none resumed)."""
    staged = tmp_path / "out/staging/fmnist-cnn.tmp"
    put(staged, "stale", checkpoint=True)
    (staged / "checkpoint" / "other-inputs.json").write_text("{}")
    _, calls = run(script, tmp_path, FRESH="2026-12-02")
    assert len(calls) == 1 and "--fresh" not in calls[0]
    assert seen_checkpoints(tmp_path) == []  # discarded before the calibration ran
    assert live(tmp_path) == '{"model": "new"}'
    (staged / "checkpoint").mkdir(parents=True)  # the same Job's next pod finds a killed pod's work
    (staged / "checkpoint" / "cut-0.json").write_text("{}")
    _, calls = run(script, tmp_path, FRESH="2026-12-02")
    assert len(calls) == 1 and seen_checkpoints(tmp_path) == ["cut-0.json"]  # resumed, not discarded
    (staged / "checkpoint").mkdir(parents=True)
    (staged / "checkpoint" / "cut-0.json").write_text("{}")
    _, calls = run(script, tmp_path, FRESH="2026-12-03")  # a new token: discarded again
    assert len(calls) == 1 and seen_checkpoints(tmp_path) == []


def seen_checkpoints(root: Path) -> list[str]:
    """The checkpoint files the stand-in qpart found when it was called."""
    return (root / "seen").read_text().split()
