"""The samples the job holds: decoded in the sample order, cut into fit, check and test samples,
in memory or in files that pickle as their names (issue 24, second layer)."""

from __future__ import annotations

import errno
import os
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qpart.models.registry import get_model
from qpart.offline.data import open_sources
from qpart.offline.errors import CalibrationOutputError
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import (
    SpilledArray,
    held_samples,
    load_data,
    prepare_work,
    sample_bytes,
    sample_folder,
)
from qpart.offline.settings import CalibrationSettings


def test_a_spilled_array_pickles_as_its_file_and_a_slice_as_a_copy(tmp_path):
    images = SpilledArray.create(tmp_path / "x.npy", (50, 1, 4, 4))
    images[:] = np.arange(800, dtype=np.float32).reshape(50, 1, 4, 4)
    whole = pickle.dumps(images)
    assert len(whole) < 200  # the file's name, not 3,200 bytes of samples
    again = pickle.loads(whole)
    assert isinstance(again, SpilledArray) and np.array_equal(again, images)
    part = pickle.loads(pickle.dumps(images[10:20], protocol=5))
    assert not isinstance(part, SpilledArray) and np.array_equal(part, images[10:20])
    assert SpilledArray.in_memory(images).__class__ is np.ndarray


@pytest.mark.parametrize("order", ["source", "digest"])
def test_the_prepare_stage_counts_every_sample_it_decodes_or_runs(order):
    """Its progress bar moves a batch at a time and ends exactly at its total (review of issue 26:
    a one-step bar showed no ETA for the stage's 17-50 s)."""
    spec = get_model("fmnist-cnn")
    settings = CalibrationSettings(fit_samples=300, check_samples=200, test_samples=400, sample_order=order,
                                   batch_size=100)
    sources = open_sources(spec, settings)
    ticks: list[int] = []
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=100)
    if order == "digest":  # a digest pass over both whole sources first: cut them to keep this quick
        sources = replace(sources, calibration=sources.calibration.select(np.arange(700)),
                          test=sources.test.select(np.arange(600)))
    data = load_data(runner, settings, sources, tick=ticks.append)
    assert sum(ticks) == prepare_work(settings, sources) and max(ticks) <= 500 and len(ticks) > 6
    assert (len(data.fit), len(data.check), len(data.test)) == (300, 200, 400)


def test_a_disk_too_small_for_the_samples_is_one_error_not_a_bus_error(tmp_path, monkeypatch):
    """The file's blocks are allocated before any sample is written (review of issue 24: a sparse
    file on a full tmpfs ended the job with SIGBUS and left the file behind)."""
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(CalibrationOutputError, match=r"cannot hold the samples in .*No space left on device"
                                                     r".*set TMPDIR"):
        SpilledArray.create(tmp_path / "x.npy", (1000, 1, 28, 28))
    assert list(tmp_path.iterdir()) == []


def test_a_worker_maps_the_samples_copy_on_write(tmp_path):
    images = SpilledArray.create(tmp_path / "x.npy", (4, 2))
    images[:] = 1.0
    images.flush()
    theirs = pickle.loads(pickle.dumps(images))
    theirs[0, 0] = 7.0  # stays in the worker
    assert images[0, 0] == 1.0 and np.load(tmp_path / "x.npy")[0, 0] == 1.0


def test_samples_go_to_files_when_every_process_copy_would_pass_the_limit():
    """The limit counts one copy per process: the job's and each validation worker's (review of
    issue 24: eight workers under a 2 GB limit held 18 GB)."""
    spec = get_model("fmnist-cnn")
    s = CalibrationSettings(spill_above_mb=100, fit_samples=4000, check_samples=6000)  # resolved
    sources = open_sources(spec, s)
    assert 50e6 < sample_bytes(s, sources) < 100e6  # 20,000 samples of 1x28x28 float32: 62.7 MB
    with sample_folder(s, sources, 1) as alone:
        assert alone is None
    with sample_folder(s, sources, 3) as shared:
        assert shared is not None and shared.is_dir() and shared.name.startswith("qpart-samples-")
    assert not shared.exists()


def test_held_samples_are_one_prepare_stage_and_their_files_go_with_the_block():
    spec = get_model("fmnist-cnn")
    s = CalibrationSettings(fit_samples=300, check_samples=200, test_samples=100, spill_above_mb=0,
                            batch_size=100)
    sources = open_sources(spec, s)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=100)
    stages: list[tuple[str, int, list[int]]] = []

    def start(label: str, total: int):
        stages.append((label, total, []))
        return stages[-1][2].append

    with held_samples(runner, s, sources, 1, start) as data:
        assert (len(data.fit), len(data.check), len(data.test)) == (300, 200, 100)
        assert all(isinstance(ds.images, SpilledArray) for ds in (data.fit, data.check, data.test))
        folder = Path(data.fit.images.filename).parent
        assert folder.name.startswith("qpart-samples-") and sorted(p.name for p in folder.iterdir()) == [
            "check.npy", "fit.npy", "test.npy"]
    assert not folder.exists()
    ((label, total, done),) = stages
    assert label.startswith("prepare") and total == prepare_work(s, sources)
    assert done == sorted(done) and done[-1] == total and len(done) > 3
