"""``qpart models register`` with preprocessing and labels, and ``qpart calibrate --data``: what a
user gets when a declaration or the data does not fit: one line, a non-zero exit, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qpart.models.data import Split
from qpart.models.sources import export_image_folder
from tests.qpart.test_cli_errors import REPO, one_line_error, qpart

NETS = textwrap.dedent("""
    from torch import nn

    def rgb():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
""")
FLAGS = ("--color", "RGB", "--resize", "8,8", "--mean", "0.5,0.4,0.3", "--std", "0.2,0.2,0.2")


@pytest.fixture
def user(tmp_path) -> Path:
    (tmp_path / "mynets.py").write_text(NETS)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 6 * 6, 5))
    save_file(net.state_dict(), str(tmp_path / "w.safetensors"))
    return tmp_path


def register(folder: Path, *args: str):
    # On PYTHONPATH as the guide says: qpart does not import a factory from the working directory.
    return qpart("models", "register", "--name", "mine", "--factory", "mynets:rgb", "--weights",
                 str(folder / "w.safetensors"), "--registry", str(folder / "registry.json"), *args,
                 cwd=folder, env={"PYTHONPATH": os.pathsep.join((str(REPO), str(folder)))})


def test_register_records_the_preprocessing_and_labels_given_as_flags(user):
    done = register(user, *FLAGS, "--labels", "a,b,c,d,e")
    assert done.returncode == 0, done.stderr
    assert "registered mine" in done.stdout and "input [3, 8, 8] from RGB images, 5 labels" in done.stdout
    (entry,) = json.loads((user / "registry.json").read_text())["models"]
    assert entry["input_shape"] == [3, 8, 8]  # from the preprocessing's output
    assert entry["card"]["labels"] == ["a", "b", "c", "d", "e"]
    assert entry["card"]["preprocess"]["mean"] == [0.5, 0.4, 0.3]
    assert entry["card"]["preprocess"]["resize"] == [8, 8]


def test_register_reads_a_card_file(user):
    card = {"preprocess": {"color": "RGB", "resize": 12, "center_crop": [8, 8], "mean": [0, 0, 0],
                           "std": [1, 1, 1]}, "labels": ["v", "w", "x", "y", "z"]}
    (user / "card.json").write_text(json.dumps(card))
    done = register(user, "--preprocess-file", str(user / "card.json"), "--input-shape", "3,8,8")
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads((user / "registry.json").read_text())["models"]
    assert entry["card"]["preprocess"]["center_crop"] == [8, 8] and entry["card"]["labels"][0] == "v"


@pytest.mark.parametrize(("args", "expected"), [
    pytest.param(("--color", "RGB", "--resize", "8,8", "--mean", "0.5", "--std", "0.2,0.2,0.2"),
                 "mean has 1 values but color mode RGB has 3 channels", id="mean-length"),
    pytest.param(("--color", "L", "--resize", "8,8", "--mean", "0.5", "--std", "0.2",
                  "--input-shape", "3,8,8"),
                 "makes samples of shape [1, 8, 8] but 'mine' takes [3, 8, 8]", id="shape-not-the-input"),
    pytest.param(("--color", "L", "--resize", "8,8", "--mean", "0.5", "--std", "0.2"),
                 "'mine' does not run on a preprocessed sample of shape [1, 8, 8]", id="model-rejects-gray"),
    pytest.param(("--color", "RGB", "--resize", "10,10", "--mean", "0,0,0", "--std", "1,1,1"),
                 "'mine' does not run on a preprocessed sample of shape [3, 10, 10]",
                 id="model-rejects-shape"),
    pytest.param((*FLAGS, "--labels", "a,b,c"), "gives logits of shape [1, 5] for one sample but 3 labels",
                 id="labels-not-one-per-logit"),
    pytest.param((*FLAGS, "--labels", "a,a,b,c,d"), "appear more than once", id="repeated-label"),
    pytest.param(("--color", "RGB", "--mean", "0,0,0"), "need --std too", id="missing-std"),
    pytest.param(("--preprocess-file", "card.json", "--color", "RGB"), "not both", id="file-and-flags"),
])
def test_a_declaration_that_does_not_fit_is_one_line_exit_2_and_writes_nothing(user, args, expected):
    (user / "card.json").write_text(json.dumps({"preprocess": {"color": "RGB"}}))
    line = one_line_error(register(user, *args), 2)
    assert expected in line
    assert not (user / "registry.json").exists()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """ImageFolder exports of 200 calibration and 200 test images, plus refused variants."""
    root = tmp_path_factory.mktemp("data")
    export_image_folder(Split.CALIBRATION, root / "cal", limit=200)
    export_image_folder(Split.TEST, root / "test", limit=200)
    shutil.copytree(root / "test", root / "test-without-9")
    shutil.rmtree(root / "test-without-9" / "9")
    for name in ("cal", "test"):
        shutil.copytree(root / name, root / f"{name}-5",
                        ignore=lambda d, names: [n for n in names if n in "56789"])
    return root


def calibrate(root: Path, out: Path, *args: str):
    return qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), *args, cwd=root)


@pytest.mark.slow
@pytest.mark.parametrize(("data", "test", "status", "expected"), [
    pytest.param("cal", "cal", 1, "200 test samples are also in the calibration source", id="overlap"),
    pytest.param("cal", "test-without-9", 1, "different classes (only in calibration: '9'", id="class-sets"),
    pytest.param("cal-5", "test-5", 1, "the data has 5 classes but 'fmnist-cnn' gives 10 logits",
                 id="class-count"),
    pytest.param("cal", None, 2, "needs a test source", id="no-test-source"),
])
def test_calibrate_refuses_data_in_one_line_and_leaves_out_untouched(folders, tmp_path, data, test, status,
                                                                     expected):
    out = tmp_path / "out"
    args = ["--data", str(folders / data)] + ([] if test is None else ["--test-data", str(folders / test)])
    line = one_line_error(calibrate(folders, out, *args), status)
    assert expected in line
    assert not out.exists()
    out.mkdir()
    (out / "artifact.json").write_text("kept")
    one_line_error(calibrate(folders, out, *args), status)
    assert [p.name for p in out.iterdir()] == ["artifact.json"]
    assert (out / "artifact.json").read_text() == "kept"


SMALL = ("--levels", "0.05", "--fit-samples", "100", "--check-samples", "100", "--noise-samples", "50",
         "--mapping-points", "4", "--threads", "1", "--workers", "1", "--no-baseline")
SMALL_ENV = {"QPART_CALIB_CUTS": "[0, 8]", "QPART_CALIB_MEASURE_BOTH": "false",
             "QPART_CALIB_BATCH_SIZE": "100"}


@pytest.mark.slow
def test_an_image_that_fails_to_decode_is_one_error_and_out_stays_empty(folders, tmp_path):
    """Found only while the samples are decoded (after the stage's progress line): the error is the
    last line and the only other lines are that stage's start; nothing is written to --out, so the
    same command runs once the image is fixed (a review found a checkpoint written before the
    decoding, which then refused the fixed data as 'other inputs')."""
    data = tmp_path / "test"
    shutil.copytree(folders / "test", data)
    victim = sorted((data / "3").iterdir())[0]
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])  # a truncated PNG
    out = tmp_path / "out"
    args = ("--data", str(folders / "cal"), "--test-data", str(data), *SMALL)
    done = qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), *args, cwd=folders, env=SMALL_ENV)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and victim.name in lines[-1], done.stderr
    assert all(line.startswith("prepare: decode samples") for line in lines[:-1]), done.stderr
    assert len(lines) == 2 and "Traceback" not in done.stderr
    assert not out.exists()
    victim.write_bytes(good)
    fixed = qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), *args, cwd=folders, env=SMALL_ENV)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert (out / "artifact.json").is_file() and not (out / "checkpoint").exists()


@pytest.mark.slow
def test_sigterm_removes_the_sample_files_and_keeps_the_checkpoints(folders, tmp_path):
    """kubectl delete, docker stop and timeout send SIGTERM: the job ends as on an error, so its
    temporary sample files go (review of issue 24: they were left, 12 GB a killed job at 224x224)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "out"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QPART_")}, "PYTHONPATH": str(REPO),
           **SMALL_ENV, "QPART_CALIB_SPILL_ABOVE_MB": "0", "TMPDIR": str(scratch)}
    cmd = [sys.executable, "-m", "qpart", "calibrate", "--model", "fmnist-cnn", "--out", str(out),
           "--data", str(folders / "cal"), "--test-data", str(folders / "test"), *SMALL]
    with subprocess.Popen(cmd, cwd=folders, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint" / "tables.json").exists():  # past decoding, into the stages
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.05)
        assert next(p.name for p in scratch.iterdir()).startswith("qpart-samples-")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.communicate()[1]
    assert list(scratch.iterdir()) == []
    assert (out / "checkpoint" / "tables.json").is_file() and not (out / "artifact.json").exists()


@pytest.mark.slow
def test_sigterm_during_validation_stops_the_workers_at_once(tmp_path):
    """With a pool of validation workers, SIGTERM ends the job in seconds, not when the running cuts
    finish (review of issue 24: 39 s, past a container's grace period), with no worker traceback."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QPART_")}, "PYTHONPATH": str(REPO),
           "TMPDIR": str(scratch), "QPART_CALIB_SPILL_ABOVE_MB": "0", "QPART_CALIB_CUTS": "[0, 4, 8]",
           "QPART_CALIB_MEASURE_BOTH": "false", "QPART_CALIB_TEST_SAMPLES": "2000"}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "qpart", "calibrate", "--model", "fmnist-cnn", "--out", str(out), "--levels",
           "0.05", "--fit-samples", "1000", "--check-samples", "1000", "--noise-samples", "50",
           "--mapping-points", "4", "--threads", "2", "--workers", "2", "--no-baseline"]
    err = tmp_path / "stderr"
    with err.open("w") as sink, subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                                 stderr=sink) as proc:
        deadline = time.monotonic() + 180
        while "validate + test" not in err.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, err.read_text()
        assert time.monotonic() - sent < 15
    assert "Traceback" not in err.read_text() and list(scratch.iterdir()) == []


@pytest.mark.slow
def test_calibrate_names_an_unknown_source(folders, tmp_path):
    line = one_line_error(calibrate(folders, tmp_path / "out", "--data", "imagenet"), 2)
    assert "'imagenet' is neither fashion-mnist" in line and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_calibrate_from_image_folders_records_both_sources(folders, tmp_path):
    out = tmp_path / "out"
    done = qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), "--data", str(folders / "cal"),
                 "--test-data", str(folders / "test"), *SMALL, "--json", cwd=folders, env=SMALL_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((out / "artifact.json").read_text())
    assert doc["schema_version"] == 8 and doc["settings"]["data"] == str(folders / "cal")
    data = doc["data"]
    assert (data["calibration"]["kind"], data["calibration"]["count"], data["test"]["count"]) == (
        "image-folder", 200, 200)
    assert data["sample_order"] == "digest" and data["calibration"]["preprocess"]["resize"] == [28, 28]
    assert len(data["calibration"]["content_sha256"]) == 64 and data["test"]["split"] is None
    # --json: one document on stdout (progress went to stderr, a line per stage from the start)
    summary = json.loads(done.stdout)
    assert summary["model"] == "fmnist-cnn" and summary["cuts"] == len(doc["cuts"])
    assert summary["levels"] == [0.05] and summary["test_violations"] == sum(
        1 for p in doc["patterns"] if p["level"] > 0 and p["test_drop"] > p["level"])
    assert summary["patterns"] == len(doc["patterns"]) and summary["graded_patterns"] >= 1
    # images: the WebP ladder of the input-image plan (ADR 0015), since the folders hold images
    assert set(summary["stage_s"]) == {"prepare", "tables", "mapping", "cut_profiles", "cut_choice",
                                       "validation", "coding", "images"}
    assert 100 < summary["peak_rss_mib"]["job"] < 4096 and summary["peak_rss_mib"]["largest_worker"] >= 0
    timing = json.loads((out / "timing.json").read_text())
    assert timing["timing_s"]["peak_rss_mib_job"] == pytest.approx(summary["peak_rss_mib"]["job"], abs=0.1)
    assert all(v >= 0 for v in summary["stage_s"].values()) and summary["total_s"] >= sum(
        summary["stage_s"].values()) - 1e-3
    stages = [line.partition(":")[0] for line in done.stderr.splitlines() if " elapsed " in line]
    assert stages[0] == "prepare" and "validate + test patterns" in stages
    assert stages[-1] == "input-image ladder" and stages.index("upload coding") < stages.index(stages[-1])
