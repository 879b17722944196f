"""A calibration killed with SIGKILL in any stage, then run again, writes the same artifact.json as
one never interrupted (byte for byte); inputs that changed are refused; an output folder that
cannot be written ends the job with one line, and its checkpoints stay resumable."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

import qpart.offline.job as job_module
import qpart.profiles.artifacts as artifacts_module
from qpart.models.registry import get_model
from qpart.offline.checkpoint import CHECKPOINT_DIR, Checkpoints, checkpoint_sha256, inputs_sha256
from qpart.offline.errors import CalibrationOutputError, CheckpointMismatchError
from qpart.offline.job import calibrate
from tests.offline.resume_driver import settings

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DRIVER = Path(__file__).with_name("resume_driver.py")
ROOT = Path(__file__).parents[2]


def run_driver(out: Path, workers: int, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "QPART_TEST_RUN": str(out)}  # inherited by the job's workers: how to find them
    args = [sys.executable, str(DRIVER), str(out), str(workers), *([kill] if kill else [])]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, check=False)


def processes_of(out: Path) -> list[int]:
    """Live processes started for the driver run writing ``out`` (by their environment)."""
    tag = f"QPART_TEST_RUN={out}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and tag in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """artifact.json of uninterrupted runs, by worker count."""
    found = {}
    for workers in (1, 2):
        out = tmp_path_factory.mktemp(f"reference{workers}")
        done = run_driver(out, workers)
        assert done.returncode == 0, done.stderr
        assert not (out / CHECKPOINT_DIR).exists()  # removed once the artifact is written
        found[workers] = (out / "artifact.json").read_bytes()
    return found


KILLS = [
    (1, "prepare@start"),  # decoding the samples
    (1, "noise tables@1"),  # between the two batches of the tables
    (1, "accuracy mapping@3"),  # after three of six mapping points
    (1, "choose cuts@1"),  # cut 0 probed, the other cuts not yet (offline.cut_probing)
    (1, "validate + test patterns@4"),  # cut 0 done, cut 8's lossless pattern done, its levels not
    (1, "upload coding@3"),
    (1, "input-image ladder@200"),  # the WebP ladder: its check samples read, its test samples not
    (1, "write@images.json"),  # its checkpoint torn half-way through its write
    (1, "write@cut-8.json"),  # a checkpoint torn half-way through its write
    (1, "write@cut-choice.json"),
    (1, "write@validation.json"),  # the results half-written
    (1, "write@artifact.json"),
    (2, "validate + test patterns@5"),  # with two worker processes
]


@pytest.mark.parametrize(("workers", "kill"), KILLS, ids=[k for _, k in KILLS])
def test_a_job_killed_in_any_stage_resumes_to_the_same_artifact(tmp_path, reference, workers, kill):
    out = tmp_path / "out"
    killed = run_driver(out, workers, kill)
    assert killed.returncode == -9, killed.stderr  # SIGKILL: nothing ran after the kill
    assert not (out / "artifact.json").exists()
    if workers > 1:  # the validation workers died with the job (no orphan goes on computing)
        assert processes_of(out) == []
    done = run_driver(out, workers)
    assert done.returncode == 0, done.stderr
    assert (out / "artifact.json").read_bytes() == reference[workers]
    assert not (out / CHECKPOINT_DIR).exists()
    assert not list(out.glob("*.tmp*"))


def test_resuming_with_other_settings_is_refused_with_how_to_start_afresh(tmp_path):
    out = tmp_path / "out"
    assert run_driver(out, 1, "accuracy mapping@2").returncode == -9
    changed = settings(1).model_copy(update={"levels": (0.02,)})
    with pytest.raises(CheckpointMismatchError, match=r"changed: settings\.levels\).*--fresh"):
        calibrate(get_model("fmnist-cnn"), changed, out)
    assert not (out / "artifact.json").exists()
    calibrate(get_model("fmnist-cnn"), changed, out, fresh=True)  # --fresh discards them
    assert json.loads((out / "artifact.json").read_text())["settings"]["levels"] == [0.02]


def test_changed_weights_or_data_are_named(tmp_path):
    out = tmp_path / "out"
    inputs = {"model": {"weights_sha256": "a" * 64}, "data": {"calibration": {"content_sha256": "b"}},
              "settings": {"seed": 0}}
    Checkpoints.open(out, inputs)
    Checkpoints.open(out, inputs)  # the same inputs: resumed
    other = {**inputs, "model": {"weights_sha256": "c" * 64},
             "data": {"calibration": {"content_sha256": "d"}}}
    with pytest.raises(CheckpointMismatchError,
                       match=r"changed: data\.calibration\.content_sha256, model\.weights_sha256\)"):
        Checkpoints.open(out, other)


def test_a_checkpoint_that_is_not_json_is_refused(tmp_path):
    ck = Checkpoints.open(tmp_path, {"settings": {}})
    ck.path("tables").write_text('{"tables": [')
    with pytest.raises(CheckpointMismatchError, match=r"not a checkpoint this job wrote.*--fresh"):
        ck.load("tables")


def test_an_edited_checkpoint_is_refused_in_one_line_naming_it(tmp_path):
    ck = Checkpoints.open(tmp_path, {"settings": {"seed": 0}})
    ck.save("cut-0", {"levels": [{"pattern": {"weight_bits": {"conv1.weight": 8}}}]})
    assert ck.load("cut-0") == {"levels": [{"pattern": {"weight_bits": {"conv1.weight": 8}}}]}
    file = ck.path("cut-0")
    file.write_text(file.read_text().replace('"conv1.weight":8', '"conv1.weight":1'))
    with pytest.raises(CheckpointMismatchError) as refused:
        ck.load("cut-0")
    message = str(refused.value)
    assert str(file) in message and "changed after the job wrote it" in message and "--fresh" in message
    assert "\n" not in message


def test_a_document_with_integer_keys_loads_back(tmp_path):
    """JSON makes integer keys strings, which sort otherwise: the seal is over the loaded form."""
    ck = Checkpoints.open(tmp_path, {"settings": {"seed": 0}})
    ck.save("coding", {"zstd": {2: 1.5, 10: 2.5}})
    assert ck.load("coding") == {"zstd": {"2": 1.5, "10": 2.5}}


def test_a_checkpoint_renamed_or_from_other_inputs_is_refused(tmp_path):
    ck = Checkpoints.open(tmp_path / "a", {"settings": {"seed": 0}})
    ck.save("cut-0", {"levels": []})
    ck.path("cut-0").rename(ck.path("cut-4"))  # a finished cut's record passed off as another's
    with pytest.raises(CheckpointMismatchError, match=r"cut-4\.json was changed after the job wrote it"):
        ck.load("cut-4")
    other = Checkpoints.open(tmp_path / "b", {"settings": {"seed": 1}})
    other.path("cut-4").write_bytes(ck.path("cut-4").read_bytes())
    with pytest.raises(CheckpointMismatchError, match=r"changed after the job wrote it"):
        other.load("cut-4")


def test_an_edited_inputs_record_is_refused(tmp_path):
    inputs = {"settings": {"seed": 0}}
    ck = Checkpoints.open(tmp_path, inputs)
    ck.path("inputs").write_text(ck.path("inputs").read_text().replace('"seed":0', '"seed":1'))
    with pytest.raises(CheckpointMismatchError, match=r"inputs\.json was changed after the job wrote it"):
        Checkpoints.open(tmp_path, {"settings": {"seed": 1}})


def test_a_finished_cut_edited_before_resuming_is_refused_and_not_served(tmp_path):
    """End to end (issue 52, finding 9): a killed job's finished cut 0 edited to 1-bit activations, then
    the same command: refused in one line before any artifact is written; --fresh starts afresh."""
    out = tmp_path / "out"
    assert run_driver(out, 1, "validate + test patterns@4").returncode == -9
    file = out / CHECKPOINT_DIR / "cut-0.json"
    sealed = json.loads(file.read_text())
    for level in sealed.get("doc", sealed)["levels"]:  # (an unsealed record before issue 52)
        level["pattern"].update(activation_bits=1, calib_drop_ub=0.0)
    file.write_text(json.dumps(sealed))
    inputs = json.loads((out / CHECKPOINT_DIR / "inputs.json").read_text())["doc"]
    with pytest.raises(CheckpointMismatchError) as refused:  # asked before decoding a sample
        Checkpoints.refuse_other_inputs(out, inputs)
    assert str(file) in str(refused.value)
    with pytest.raises(CheckpointMismatchError) as refused:
        calibrate(get_model("fmnist-cnn"), settings(1), out)
    message = str(refused.value)
    assert str(file) in message and "--fresh" in message and "\n" not in message
    assert not (out / "artifact.json").exists()


def test_a_finished_cut_edited_and_resealed_is_refused_by_its_pattern_ids(tmp_path):
    """Issue 52, review finding 9: the seal recomputed after the bits were edited (anyone who can
    write the folder can): the pattern ids, recomputed from the bits, refuse it in one line."""
    out = tmp_path / "out"
    assert run_driver(out, 1, "validate + test patterns@4").returncode == -9
    file = out / CHECKPOINT_DIR / "cut-0.json"
    inputs = json.loads((out / CHECKPOINT_DIR / "inputs.json").read_text())["doc"]
    sealed = json.loads(file.read_text())
    for level in sealed["doc"]["levels"]:
        level["pattern"].update(activation_bits=1, calib_drop_ub=0.0)
    sealed["sha256"] = checkpoint_sha256("cut-0", inputs_sha256(inputs), sealed["doc"])
    file.write_text(json.dumps(sealed))
    Checkpoints.refuse_other_inputs(out, inputs)  # the seal holds
    with pytest.raises(CheckpointMismatchError) as refused:
        calibrate(get_model("fmnist-cnn"), settings(1), out)
    message = str(refused.value)
    assert "cut-0.json" in message and "--fresh" in message and "\n" not in message
    assert not (out / "artifact.json").exists()


def test_an_unwritable_output_folder_is_one_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CalibrationOutputError, match=r"cannot create the output folder .*a-file/out"):
        calibrate(get_model("fmnist-cnn"), settings(1), blocker / "out")


@pytest.mark.parametrize("failing", ["cut-8.json", "coding.json", "validation.json", "artifact.json"])
def test_a_full_disk_leaves_no_partial_artifact_and_resumable_checkpoints(tmp_path, monkeypatch, reference,
                                                                         failing):
    out = tmp_path / "out"
    real = os.fsync

    def full_disk(fd: int) -> None:  # the disk fills as ``failing`` is flushed
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{failing}.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(CalibrationOutputError, match=r"No space left on device.*checkpoints in .* are kept"):
        calibrate(get_model("fmnist-cnn"), settings(1), out)
    assert not (out / "artifact.json").exists()
    assert not list(out.glob("*.tmp*"))
    assert not list((out / CHECKPOINT_DIR).glob("*.tmp*"))
    monkeypatch.undo()
    calibrate(get_model("fmnist-cnn"), settings(1), out)
    assert (out / "artifact.json").read_bytes() == reference[1]


def test_write_atomic_removes_its_temporary_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    target.write_text("old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        artifacts_module.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert not (tmp_path / "x.json.tmp").exists()


def test_samples_held_in_files_give_the_same_artifact_and_leave_no_file(tmp_path, reference, monkeypatch):
    """spill_above_mb=0: the fit, check and test samples live in mapped files, which the two
    validation workers map again (not copies through their pipes); the artifact is the in-memory
    run's, byte for byte, and the files go when the job ends."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    calibrate(get_model("fmnist-cnn"), settings(2).model_copy(update={"spill_above_mb": 0}), tmp_path / "out")
    assert (tmp_path / "out" / "artifact.json").read_bytes() == reference[2]
    assert list(scratch.iterdir()) == []


def test_a_job_that_fails_removes_its_sample_files(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen = []

    def fail(*args: object, **kwargs: object) -> None:
        seen.extend(p.name for p in scratch.glob("qpart-samples-*/*"))
        raise CalibrationOutputError("stop here")

    monkeypatch.setattr(job_module, "_tables", fail)
    with pytest.raises(CalibrationOutputError, match="stop here"):
        calibrate(get_model("fmnist-cnn"), settings(1).model_copy(update={"spill_above_mb": 0}),
                  tmp_path / "out")
    assert sorted(seen) == ["check.npy", "fit.npy", "test.npy"]
    assert list(scratch.iterdir()) == []


def test_a_job_with_other_weights_is_refused_naming_them(tmp_path):
    """End to end: a killed job's checkpoints, then the same command with one bit of the weights
    flipped (review of issue 26: the test above only feeds Checkpoints a made-up document)."""
    out = tmp_path / "out"
    assert run_driver(out, 1, "accuracy mapping@2").returncode == -9
    spec = get_model("fmnist-cnn")
    flipped = tmp_path / "w.safetensors"
    data = bytearray(spec.weights.read_bytes())
    data[-1] ^= 1
    flipped.write_bytes(bytes(data))
    with pytest.raises(CheckpointMismatchError, match=r"changed: model\.weights_sha256\).*--fresh"):
        calibrate(replace(spec, weights=flipped), settings(1), out)
    assert not (out / "artifact.json").exists() and (out / CHECKPOINT_DIR / "mapping.json").is_file()
