"""A hostile ImageFolder cannot hang or widen calibration: a FIFO, a link to a device, a class
folder linked outside the root and an oversized file are each refused quickly, naming the entry
(issue 52, findings 7 and 8). Each read runs in a thread joined with a timeout, so a regression
fails here instead of hanging the suite."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from qpart.models.errors import ImageDecodeError, ImageFolderError
from qpart.models.sources import ImageFolderSource
from qpart.models.sources.decoding import decode_pixels
from qpart.models.sources.files import MAX_FILE_BYTES, read_regular
from tests.models.sources.conftest import SPEC, write_image

DEADLINE_S = 10.0


def finishes(work: Callable[[], object]) -> BaseException | None:
    """What ``work`` raised (None: nothing), failing the test if it runs past the deadline."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            raised.append(None)
        except BaseException as exc:  # handed to the test to check
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)  # daemon: a hung read cannot stop pytest
    thread.start()
    thread.join(DEADLINE_S)
    assert raised, f"still reading after {DEADLINE_S} s: a hostile file hangs the job"
    return raised[0]


def digests_of(root: Path) -> Callable[[], object]:
    return lambda: ImageFolderSource(root, SPEC).sample_digests()


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "images"
    write_image(root / "cat" / "a.png", 1)
    write_image(root / "dog" / "b.png", 2)
    return root


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_like_an_image_is_refused_not_read_forever(root):
    fifo = root / "cat" / "x.png"
    os.mkfifo(fifo)
    exc = finishes(digests_of(root))
    assert isinstance(exc, ImageDecodeError)
    assert str(fifo) in str(exc) and "not a regular file (a FIFO)" in str(exc)
    assert "\n" not in str(exc)
    exc = finishes(lambda: decode_pixels(str(fifo), SPEC))  # the decoder refuses it too
    assert isinstance(exc, ImageDecodeError) and "a FIFO" in str(exc)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_image_linked_to_dev_zero_is_refused_not_read_forever(root):
    link = root / "cat" / "x.png"
    link.symlink_to("/dev/zero")
    exc = finishes(digests_of(root))
    assert isinstance(exc, ImageFolderError)
    assert str(link) in str(exc) and "/dev/zero, outside the ImageFolder" in str(exc)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_swapped_in_after_the_scan_is_refused_when_read(root, tmp_path):
    source = ImageFolderSource(root, SPEC)
    inside = root / "cat" / "a.png"
    inside.unlink()
    inside.symlink_to("/dev/zero")  # after the scan checked the folder's links
    exc = finishes(source.sample_digests)
    assert isinstance(exc, ImageDecodeError)
    assert str(inside) in str(exc) and "a character device" in str(exc)


def test_a_class_folder_linked_outside_the_root_is_refused_naming_it(root, tmp_path):
    outside = tmp_path / "elsewhere"
    write_image(outside / "system.png", 3)
    (root / "bird").symlink_to(outside, target_is_directory=True)
    exc = finishes(digests_of(root))
    assert isinstance(exc, ImageFolderError)
    assert f"class folder {root / 'bird'} is a link to {outside}, outside the ImageFolder" in str(exc)


def test_a_link_inside_the_root_is_still_read(root):
    (root / "cow").symlink_to(root / "cat", target_is_directory=True)
    (root / "dog" / "c.png").symlink_to(root / "cat" / "a.png")
    source = ImageFolderSource(root, SPEC)
    assert source.files == ("cat/a.png", "cow/a.png", "dog/b.png", "dog/c.png")
    assert finishes(source.sample_digests) is None


def test_a_sparse_file_of_a_gigabyte_is_refused_before_it_is_read(root):
    huge = root / "dog" / "huge.png"
    with huge.open("wb") as handle:
        handle.truncate(1 << 30)
    exc = finishes(digests_of(root))
    assert isinstance(exc, ImageDecodeError)
    assert str(huge) in str(exc) and f"more than the {MAX_FILE_BYTES}" in str(exc)


def test_an_image_swapped_for_a_link_outside_the_root_after_the_scan_is_refused(root, tmp_path):
    """Issue 52, review finding 8: the link check holds when the file is read, not only at the scan."""
    outside = write_image(tmp_path / "elsewhere" / "secret.png", 3)
    source = ImageFolderSource(root, SPEC)
    inside = root / "cat" / "a.png"
    inside.unlink()
    inside.symlink_to(outside)  # after the scan checked the folder's links
    for read in (source.sample_digests, lambda: next(source.batches(2))):
        exc = finishes(read)
        assert isinstance(exc, ImageDecodeError)
        assert str(inside) in str(exc) and f"{outside}, outside the ImageFolder {root}" in str(exc)
        assert "\n" not in str(exc)


def test_read_regular_checks_the_root_only_when_given(root, tmp_path):
    outside = write_image(tmp_path / "elsewhere" / "secret.png", 3)
    assert read_regular(outside) == outside.read_bytes()
    assert read_regular(root / "cat" / "a.png", root=root) == (root / "cat" / "a.png").read_bytes()
    with pytest.raises(ImageDecodeError, match="outside the ImageFolder"):
        read_regular(outside, root=root)
