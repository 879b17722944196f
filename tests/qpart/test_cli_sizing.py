"""``qpart calibrate`` on little data (issue 48): levels the check samples cannot certify are refused
in one line naming ``--uncertified lossless``, or kept lossless and said so everywhere; a card whose
labels name the data's classes in another order is refused in one line naming ``--labels map``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qpart.models.data import Split
from qpart.models.registry import get_model
from qpart.models.sources import ArraySource, export_image_folder
from qpart.offline.data import Sources, align_labels
from tests.qpart.test_cli_data import SMALL_ENV
from tests.qpart.test_cli_errors import REPO, one_line_error, qpart

QUICK = ("--noise-samples", "50", "--mapping-points", "4", "--threads", "1", "--workers", "1",
         "--no-baseline")
QUICK_ENV = {**SMALL_ENV, "QPART_CALIB_IMAGE_QUALITIES": "[]"}
CARD = get_model("fmnist-cnn").labels


@pytest.fixture(scope="module")
def little(tmp_path_factory) -> Path:
    """359 calibration and 200 test images of Fashion-MNIST as ImageFolders."""
    root = tmp_path_factory.mktemp("little")
    export_image_folder(Split.CALIBRATION, root / "cal", limit=359)
    export_image_folder(Split.TEST, root / "test", limit=200)
    return root


def calibrate(root: Path, out: Path, *args: str, env: dict[str, str] | None = None):
    return qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), "--data", str(root / "cal"),
                 "--test-data", str(root / "test"), *args, cwd=root, env=env)


@pytest.mark.slow
def test_359_images_refuse_the_levels_216_check_samples_cannot_certify(little, tmp_path):
    line = one_line_error(calibrate(little, tmp_path / "out", *QUICK, env=QUICK_ENV), 2)
    assert "levels 0.1%, 0.25%, 0.5%, 1% cannot be certified with 216 check samples" in line
    assert "0.1% needs 3,688" in line and "--uncertified lossless" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_counts_the_data_cannot_hold_are_refused_before_decoding(little, tmp_path):
    line = one_line_error(calibrate(little, tmp_path / "out", "--fit-samples", "300", "--check-samples",
                                    "300", *QUICK, env=QUICK_ENV), 2)
    assert "--fit-samples 300 + --check-samples 300 ask for 600" in line
    assert "--fit-samples 143 --check-samples 216" in line and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_with_uncertified_lossless_the_levels_stay_float32_and_every_record_says_so(little, tmp_path):
    out = tmp_path / "artifacts" / "fmnist-cnn"
    done = calibrate(little, out, "--uncertified", "lossless", *QUICK, env=QUICK_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    kept = [0.001, 0.0025, 0.005, 0.01]
    assert "(8 of them lossless, untested: 0.1%, 0.25%, 0.5%, 1% kept float32" in done.stdout  # 4 at 2 cuts
    doc = json.loads((out / "artifact.json").read_text())
    assert doc["schema_version"] == 8 and doc["lossless_levels"] == kept
    assert (doc["settings"]["fit_samples"], doc["settings"]["check_samples"]) == (143, 216)
    assert (doc["data"]["fit_samples"], doc["data"]["check_samples"]) == (143, 216)
    for p in doc["patterns"]:
        if p["level"] in kept:
            assert p["activation_bits"] == 32 and set(p["weight_bits"].values()) <= {32}
            assert p["rungs"] is None and p["calib_drop_ub"] is None
    assert any(p["level"] == 0.02 and p["rungs"] for p in doc["patterns"])  # 2% was tested
    report = (out / "report.md").read_text()
    assert "Levels kept lossless: 0.1%, 0.25%, 0.5%, 1%." in report and "216 check samples" in report
    assert "noise tables 0–50" in report and "official t10k" not in report
    assert f"test = image-folder {little / 'test'}, 200 samples" in report


def _arrays(path: Path, count: int, classes: list[str], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.random((count, 1, 28, 28), dtype=np.float32),
             y=np.arange(count) % len(classes), classes=np.array(classes))
    return path


@pytest.mark.slow
def test_labels_in_another_order_than_the_data_are_refused_showing_both_and_the_flag(tmp_path):
    reordered = sorted(CARD)
    _arrays(tmp_path / "cal.npz", 400, reordered, 1)
    _arrays(tmp_path / "test.npz", 100, reordered, 2)
    args = ("--data", str(tmp_path / "cal.npz"), "--test-data", str(tmp_path / "test.npz"), *QUICK)
    cmd = ("calibrate", "--model", "fmnist-cnn", "--out", str(tmp_path / "out"), *args)
    line = one_line_error(qpart(*cmd, cwd=tmp_path, env=QUICK_ENV), 1)
    assert f"names its labels in the order {', '.join(CARD)}" in line
    assert f"the data's classes are {', '.join(reordered)}" in line and "--labels map" in line
    # mapped, the labels pass: the next refusal is the sizing's (before any decoding)
    line = one_line_error(qpart(*cmd, "--labels", "map", "--fit-samples", "1000", cwd=tmp_path,
                                env=QUICK_ENV), 2)
    assert "--fit-samples 1000" in line and not (tmp_path / "out").exists()


def test_map_renumbers_the_data_into_the_cards_order(tmp_path):
    reordered = sorted(CARD)
    cal = ArraySource(_arrays(tmp_path / "cal.npz", 30, reordered, 1))
    test = ArraySource(_arrays(tmp_path / "test.npz", 20, reordered, 2))
    mapped = align_labels(get_model("fmnist-cnn"), Sources(cal, test, "source"), "map")
    for before, after in ((cal, mapped.calibration), (test, mapped.test)):
        assert after.class_names == CARD
        names = [before.class_names[i] for i in before.labels()]
        assert [CARD[i] for i in after.labels()] == names
        assert [CARD[i] for b in after.batches(7) for i in b.labels] == names
    same = Sources(ArraySource(_arrays(tmp_path / "same.npz", 30, list(CARD), 3)), test, "source")
    assert align_labels(get_model("fmnist-cnn"), same, "check") is same  # same order: as today


@pytest.mark.slow
def test_sigterm_twice_ends_calibrate_with_143_and_one_line(little, tmp_path):
    """A process group's SIGTERM and a supervisor's second one: the clean-up is not interrupted, no
    traceback, the job's last word is one line."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QPART_")}, "PYTHONPATH": str(REPO),
           **QUICK_ENV}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "qpart", "calibrate", "--model", "fmnist-cnn", "--out", str(out),
           "--data", str(little / "cal"), "--test-data", str(little / "test"), "--levels", "0.02", *QUICK]
    err = tmp_path / "stderr"
    with err.open("w") as sink, subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                                 stderr=sink) as proc:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint" / "tables.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text, text
    assert text.strip().splitlines()[-1].startswith("error: terminated (SIGTERM)"), text
