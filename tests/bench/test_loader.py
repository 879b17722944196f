"""The loader benchmark generates a readable ImageFolder and reports a complete measurement."""

from __future__ import annotations

from bench.micro.loader import IMAGENET_SPEC, _run_isolated, generate_folder
from qpart.models.sources import ImageFolderSource


def test_the_generated_folder_streams_and_is_measured(tmp_path):
    folder = tmp_path / "images"
    assert generate_folder(folder, 5) > 0
    source = ImageFolderSource(folder, IMAGENET_SPEC)
    assert len(source) == 5 and len(source.class_names) == 5
    # in its own process, as the benchmark measures (this test process's peak is every earlier
    # test's: 1.7 GB after tests/server in one session)
    row = _run_isolated(folder, workers=0, batch=2)
    assert row["images"] == 5 and row["images_per_s"] > 0 and row["first_batch_s"] is not None
    assert row["peak_rss_bytes"] > 0 and row["within_bound"] is True
    assert row["largest_worker_peak_rss_bytes"] == 0
