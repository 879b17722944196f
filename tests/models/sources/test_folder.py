"""ImageFolder: torchvision's class and file order, streaming batches, digests, worker processes,
and one-line refusals of empty folders and bad images."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qpart.models.errors import DatasetError, ImageDecodeError, ImageFolderError, PreprocessError
from qpart.models.preprocess import PreprocessSpec, preprocess_image
from qpart.models.sources import ImageFolderSource, find_classes
from tests.models.sources.conftest import SPEC, write_image


def read_all(source, batch_size=2):
    batches = list(source.batches(batch_size))
    return np.concatenate([b.images for b in batches]), np.concatenate([b.labels for b in batches])


def test_classes_are_sorted_as_torchvision_sorts_them(tmp_path):
    names = ["b", "a", "B", "10", "2", "_x", ".hidden"]
    for i, name in enumerate(names):
        write_image(tmp_path / name / "img.png", i)
    (tmp_path / "notes.txt").write_bytes(b"not a class")  # an image here is refused (test_unlabelled)
    expected = sorted(entry.name for entry in os.scandir(tmp_path) if entry.is_dir())
    assert find_classes(tmp_path) == tuple(expected) == (".hidden", "10", "2", "B", "_x", "a", "b")
    assert ImageFolderSource(tmp_path, SPEC).class_names == tuple(expected)


def test_files_follow_torchvisions_walk_and_only_image_extensions_count(tmp_path):
    for rel in ["c/b.PNG", "c/a.jpeg", "c/sub/a.png", "c/A.webp", "c/z.JpG", "c/sub2/deep/x.png"]:
        fmt = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}[rel.rsplit(".", 1)[1].lower()]
        write_image(tmp_path / rel, len(rel), fmt=fmt)
    for ignored in ["c/notes.txt", "c/anim.gif", "c/raw.tiff", "c/png"]:
        (tmp_path / ignored).write_bytes(b"x")
    # torchvision.datasets.folder.make_dataset: sorted(os.walk(class_dir)), then sorted file names.
    expected = [str((Path(root) / f).relative_to(tmp_path))
                for root, _, files in sorted(os.walk(tmp_path / "c")) for f in sorted(files)
                if f.lower().endswith((".jpg", ".jpeg", ".png", ".webp"))]
    source = ImageFolderSource(tmp_path, SPEC)
    assert source.files == tuple(expected)
    assert source.files == ("c/A.webp", "c/a.jpeg", "c/b.PNG", "c/z.JpG", "c/sub/a.png", "c/sub2/deep/x.png")


def test_batches_stream_every_image_in_order_preprocessed_by_the_spec(folder):
    source = ImageFolderSource(folder, SPEC)
    assert source.class_names == ("cat", "dog") and len(source) == 5
    batches = list(source.batches(2))
    assert [b.images.shape for b in batches] == [(2, 3, 8, 8), (2, 3, 8, 8), (1, 3, 8, 8)]
    assert all(b.images.dtype == np.float32 and b.labels.dtype == np.int64 for b in batches)
    images, labels = np.concatenate([b.images for b in batches]), np.concatenate([b.labels for b in batches])
    assert labels.tolist() == [0, 0, 0, 1, 1] == source.labels().tolist()
    for image, rel in zip(images, source.files, strict=True):
        with Image.open(folder / rel) as img:
            assert image.tobytes() == preprocess_image(img, SPEC).tobytes()
    assert source.sample_shape == (3, 8, 8)


def test_the_record_names_the_folder_spec_count_and_digest(folder):
    record = ImageFolderSource(folder, SPEC).describe()
    assert record.kind == "image-folder" and record.location == str(folder) and record.count == 5
    assert record.classes == ("cat", "dog") and record.preprocess == SPEC and record.split is None
    assert len(record.content_sha256) == 64


def test_the_content_digest_depends_on_bytes_and_labels_not_on_where_the_folder_is(folder, tmp_path):
    digest = ImageFolderSource(folder, SPEC).content_sha256()
    assert ImageFolderSource(folder, SPEC).content_sha256() == digest
    copy = shutil.copytree(folder, tmp_path / "elsewhere")
    assert ImageFolderSource(copy, SPEC).content_sha256() == digest
    (copy / "dog" / "b.png").rename(copy / "cat" / "b.png")  # same bytes, another label
    assert ImageFolderSource(copy, SPEC).content_sha256() != digest
    victim = folder / "cat" / "c.png"
    victim.write_bytes(victim.read_bytes() + b"\0")  # one byte more: another file
    assert ImageFolderSource(folder, SPEC).content_sha256() != digest


def test_a_folder_without_class_folders_or_images_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_bytes(b"x")  # images alone would be a flat, unlabelled folder (issue 49)
    message = r"has neither class folders nor images; put each class's images in .*/<class name>/"
    with pytest.raises(ImageFolderError, match=message):
        ImageFolderSource(tmp_path, SPEC)
    with pytest.raises(ImageFolderError, match="cannot list the ImageFolder"):
        ImageFolderSource(tmp_path / "missing", SPEC)
    with pytest.raises(ImageFolderError, match="cannot list the ImageFolder"):
        ImageFolderSource(tmp_path / "loose.png", SPEC)


def test_an_empty_class_is_refused_by_name(folder):
    (folder / "emu").mkdir()
    (folder / "emu" / "readme.txt").write_text("no images here")
    with pytest.raises(ImageFolderError, match=r"class folder 'emu' in .* without any .jpg/.jpeg/.png/.webp "
                                               r"image; add images or remove the folder") as err:
        ImageFolderSource(folder, SPEC)
    assert "\n" not in str(err.value)


def test_a_spec_without_a_fixed_output_shape_is_refused(folder):
    spec = PreprocessSpec(color="RGB", resize=8, mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(PreprocessError, match="fixed output shape; add a center_crop"):
        ImageFolderSource(folder, spec)


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width``×``height`` RGB pixels, with a few bytes of data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) \
        + chunk(b"IEND", b"")


def corrupt_cases(folder: Path) -> dict[str, bytes]:
    jpeg = (folder / "cat" / "m.jpeg").read_bytes()
    png = (folder / "dog" / "b.png").read_bytes()
    tiff = folder / "x.tiff"
    Image.new("RGB", (4, 4)).save(tiff, format="TIFF")
    return {
        "garbage": b"this is not an image at all",
        "empty": b"",
        "truncated-jpeg": jpeg[: len(jpeg) // 2],
        "truncated-png": png[: len(png) - 30],
        "tiff-named-png": tiff.read_bytes(),
        "gigapixel-header": png_declaring(100_000, 100_000),
        "large-header": png_declaring(9000, 9000),
    }


@pytest.mark.parametrize("case", ["garbage", "empty", "truncated-jpeg", "truncated-png", "tiff-named-png",
                                  "gigapixel-header", "large-header"])
def test_an_unreadable_image_is_refused_naming_its_file(folder, case):
    bad = folder / "dog" / "bad.png"
    bad.write_bytes(corrupt_cases(folder)[case])
    source = ImageFolderSource(folder, SPEC)  # scanning does not decode
    message = rf"{bad}.*replace or remove it|{bad} declares 9000x9000 pixels, more than"
    with pytest.raises(ImageDecodeError, match=message) as err:
        read_all(source)
    assert "\n" not in str(err.value)


def test_an_image_smaller_than_the_crop_is_refused_naming_its_file(folder):
    spec = PreprocessSpec(color="RGB", center_crop=(10, 10), mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(PreprocessError, match=r"cat/c.png: image is 7x30 after resizing, smaller than"):
        read_all(ImageFolderSource(folder, spec))


def test_batch_size_out_of_range_is_refused(folder):
    source = ImageFolderSource(folder, SPEC)
    for size in (0, -1, 1 << 20):
        with pytest.raises(DatasetError, match="batch size"):
            next(source.batches(size))


def test_select_keeps_order_files_and_labels(folder):
    source = ImageFolderSource(folder, SPEC)
    part = source.select(np.array([1, 3, 4]))
    assert part.files == (source.files[1], source.files[3], source.files[4])
    images, labels = read_all(part, 2)
    all_images, _ = read_all(source, 5)
    assert images.tobytes() == all_images[[1, 3, 4]].tobytes() and labels.tolist() == [0, 1, 1]
    assert part.class_names == source.class_names
    with pytest.raises(DatasetError, match="strictly increasing"):
        source.select(np.array([3, 1]))
    with pytest.raises(DatasetError, match=r"lie in 0\.\.4"):
        source.select(np.array([5]))


def test_worker_processes_give_the_same_batches_bit_for_bit(folder):
    in_process = read_all(ImageFolderSource(folder, SPEC), 3)
    with_workers = read_all(ImageFolderSource(folder, SPEC, workers=2, chunk_size=1, prefetch=2), 3)
    assert in_process[0].tobytes() == with_workers[0].tobytes()
    assert in_process[1].tolist() == with_workers[1].tolist()


def test_a_bad_image_in_a_worker_is_refused_naming_its_file(folder):
    bad = folder / "dog" / "c.png"
    bad.write_bytes(b"garbage")
    source = ImageFolderSource(folder, SPEC, workers=1, chunk_size=2)
    with pytest.raises(ImageDecodeError, match=rf"{bad} is not a readable JPEG, PNG or WebP image"):
        read_all(source)


def test_stopping_early_shuts_the_workers_down(folder):
    stream = ImageFolderSource(folder, SPEC, workers=1, chunk_size=1).batches(1)
    first = next(stream)
    stream.close()
    assert first.images.shape == (1, 3, 8, 8)


def test_worker_count_is_bounded(folder):
    with pytest.raises(DatasetError, match="decoding workers"):
        next(ImageFolderSource(folder, SPEC, workers=-1).batches(2))
