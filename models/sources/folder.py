"""Images in torchvision's ImageFolder layout: ``root/<class>/.../<image>``, one folder per class;
or, without labels, a flat folder of images (``root/<image>``, no subfolder): its samples have no
class (:data:`~qpart.models.sources.base.UNLABELLED`), which only a label-free metric can judge.

Classes and files are ordered as ``torchvision.datasets.ImageFolder`` orders them: class folders
sorted by name (a label is a class's position), then within a class the sorted walk of its
folder and, in each folder, the sorted file names. Files count when their name ends in ``.jpg``,
``.jpeg``, ``.png`` or ``.webp`` (any case); others are ignored. Unlike torchvision, symbolic links
to folders inside a class are not followed (a link loop cannot hang the scan), a class folder or
image that is a link leading outside the root is refused, and only regular files of at most
:data:`~qpart.models.sources.files.MAX_FILE_BYTES` are read (:mod:`qpart.models.sources.files`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from qpart.models.errors import ImageFolderError, PreprocessError
from qpart.models.preprocess import PreprocessSpec, normalize_pixels
from qpart.models.sources.base import (
    UNLABELLED,
    Batch,
    DataSource,
    Indices,
    Labels,
    SplitRecord,
    check_batch_size,
    check_selection,
)
from qpart.models.sources.decoding import iter_pixel_chunks
from qpart.models.sources.files import check_inside, read_regular

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
"""The subset of torchvision's ``IMG_EXTENSIONS`` read here, compared case-insensitively."""
DEFAULT_CHUNK = 32


def find_classes(root: Path) -> tuple[str, ...]:
    """The class folder names under ``root``, sorted as torchvision sorts them.

    Raises:
        ImageFolderError: ``root`` is not a readable folder or has no subfolder, or a class folder
            is a link leading outside ``root``.
    """
    try:
        with os.scandir(root) as entries:
            found = sorted((entry.name, entry.is_symlink()) for entry in entries if entry.is_dir())
    except OSError as exc:
        raise ImageFolderError(f"cannot list the ImageFolder {root}: {exc.strerror or exc}") from exc
    for name, link in found:
        if link:
            check_inside(root, root / name, "the class folder")
    classes = [name for name, _ in found]
    if not classes:
        raise ImageFolderError(
            f"{root} has neither class folders nor images; put each class's images in {root}/<class name>/, "
            f"or, without labels, the images themselves in {root}/")
    return tuple(classes)


def flat_images(root: Path) -> tuple[str, ...] | None:
    """The image files directly in ``root``, sorted by name, when it has no subfolder (a flat,
    unlabelled folder); None when it has subfolders and no image there (an ImageFolder) or nothing.

    Raises:
        ImageFolderError: ``root`` is not a readable folder, holds both images and subfolders (which
            of them the user meant cannot be told: none is skipped silently), or an image is a link
            leading outside it.
    """
    try:
        with os.scandir(root) as entries:
            listed = [(entry.name, entry.is_dir(), entry.is_symlink()) for entry in entries]
    except OSError as exc:
        raise ImageFolderError(f"cannot list the ImageFolder {root}: {exc.strerror or exc}") from exc
    images = sorted(name for name, is_dir, _ in listed
                    if not is_dir and name.lower().endswith(IMAGE_EXTENSIONS))
    folders = sorted(name for name, is_dir, _ in listed if is_dir)
    if folders and images:
        raise ImageFolderError(
            f"{root} holds both images ({len(images)}, e.g. {images[0]!r}) and subfolders ({len(folders)}, "
            f"e.g. {folders[0]!r}): put every image in a class folder (labelled), or all of them "
            f"directly in {root} with no subfolder (no labels)")
    if folders:
        return None
    for name, _, link in listed:
        if link and name in images:
            check_inside(root, root / name, "the image")
    return tuple(images) or None


def _raise_walk_error(exc: OSError) -> None:
    raise ImageFolderError(f"cannot list {exc.filename}: {exc.strerror or exc}") from exc


def find_images(root: Path, classes: Sequence[str]) -> tuple[tuple[str, ...], Labels]:
    """Every image file of every class, in torchvision's order, as paths relative to ``root``.

    Raises:
        ImageFolderError: a class folder holds no image file.
    """
    files: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for label, name in enumerate(classes):
        before = len(files)
        for folder, _, names in sorted(os.walk(root / name, onerror=_raise_walk_error)):
            rel = Path(folder).relative_to(root)
            images = [f for f in sorted(names) if f.lower().endswith(IMAGE_EXTENSIONS)]
            for f in images:
                if os.path.islink(root / rel / f):
                    check_inside(root, root / rel / f, "the image")
            files.extend(str(rel / f) for f in images)
        if len(files) == before:
            empty.append(name)
        labels.extend([label] * (len(files) - before))
    if empty:
        shown = ", ".join(repr(e) for e in empty[:5])
        shown += f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        verb = "class folders" if len(empty) > 1 else "class folder"
        raise ImageFolderError(f"{verb} {shown} in {root} without any {'/'.join(IMAGE_EXTENSIONS)} image; "
                               f"add images or remove the folder")
    return tuple(files), np.asarray(labels, dtype=np.int64)


def file_sha256(path: Path, root: Path | None = None) -> str:
    """sha256 hex of a file's bytes.

    Raises:
        ImageDecodeError: not a readable regular file of at most ``MAX_FILE_BYTES`` (named), or,
            with ``root``, one outside it once opened.
    """
    return hashlib.sha256(read_regular(path, root=root)).hexdigest()


class ImageFolderSource(DataSource):
    """An ImageFolder decoded with Pillow and preprocessed by a spec with a fixed output shape.

    Args:
        root: the folder holding one subfolder per class.
        spec: the preprocessing; it must fix the output shape (a center crop or an [H, W] resize).
        workers: processes decoding images; 0 decodes in this process.
        chunk_size: files per task handed to a worker.
        prefetch: chunks in flight at most with workers (default ``2 * workers``).

    Raises:
        ImageFolderError: no class folder and no image, or a class folder without images.
        PreprocessError: the spec's output shape depends on the image.
    """

    kind = "image-folder"

    def __init__(self, root: Path, spec: PreprocessSpec, *, workers: int = 0, chunk_size: int = DEFAULT_CHUNK,
                 prefetch: int | None = None) -> None:
        flat = flat_images(root)
        if flat is not None:  # no labels: no classes, every label UNLABELLED
            classes: tuple[str, ...] = ()
            files, labels = flat, np.full(len(flat), UNLABELLED, dtype=np.int64)
        else:
            classes = find_classes(root)
            files, labels = find_images(root, classes)
        self._init(root, spec, classes, files, labels, None, (workers, chunk_size, prefetch), None)

    def _init(self, root: Path, spec: PreprocessSpec, classes: Sequence[str], files: tuple[str, ...],
              labels: Labels, digests: tuple[str, ...] | None, decoding: tuple[int, int, int | None],
              split: SplitRecord | None) -> None:
        shape = spec.output_shape
        if shape is None:
            raise PreprocessError("an ImageFolder needs preprocessing with a fixed output shape; "
                                  "add a center_crop or an [H, W] resize")
        workers, chunk_size, prefetch = decoding
        if chunk_size < 1:
            raise ImageFolderError(f"chunk size {chunk_size} must be at least 1")
        super().__init__(classes, labels, split)
        self._root = root
        self._spec = spec
        self._shape = shape
        self._files = files
        self._digests = digests
        self._workers = workers
        self._chunk_size = chunk_size
        self._prefetch = prefetch if prefetch is not None else 2 * max(workers, 1)

    @property
    def root(self) -> Path:
        """The folder the images are read from."""
        return self._root

    @property
    def files(self) -> tuple[str, ...]:
        """The image files in order, relative to :attr:`root`."""
        return self._files

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return self._shape

    def sample_digests(self) -> tuple[str, ...]:
        """sha256 of each image file's bytes (computed once, on first use)."""
        if self._digests is None:
            self._digests = tuple(file_sha256(self._root / f, self._root) for f in self._files)
        return self._digests

    def batches(self, batch_size: int) -> Iterator[Batch]:
        check_batch_size(batch_size)
        paths = [str(self._root / f) for f in self._files]
        starts = range(0, len(paths), batch_size)
        # Chunks never straddle batches, so each batch is filled by whole chunks.
        chunks = [paths[lo:min(lo + self._chunk_size, start + batch_size)] for start in starts
                  for lo in range(start, min(start + batch_size, len(paths)), self._chunk_size)]
        stream = iter_pixel_chunks(chunks, self._spec, workers=self._workers, prefetch=self._prefetch,
                                   root=str(self._root))
        try:
            for start in starts:
                stop = min(start + batch_size, len(paths))
                pixels = np.empty((stop - start, *self._shape), dtype=np.uint8)
                filled = 0
                while filled < stop - start:
                    chunk = next(stream)
                    pixels[filled:filled + chunk.shape[0]] = chunk
                    filled += chunk.shape[0]
                yield Batch(normalize_pixels(pixels, self._spec), self._labels[start:stop].copy())
        finally:
            stream.close()

    def select(self, indices: Indices, split: SplitRecord | None = None) -> ImageFolderSource:
        idx = check_selection(indices, len(self))
        out = ImageFolderSource.__new__(ImageFolderSource)
        digests = None if self._digests is None else tuple(self._digests[i] for i in idx.tolist())
        out._init(self._root, self._spec, self._class_names, tuple(self._files[i] for i in idx.tolist()),
                  self._labels[idx], digests, (self._workers, self._chunk_size, self._prefetch), split)
        return out

    def _location(self) -> str:
        return str(self._root)

    def _preprocess(self) -> PreprocessSpec:
        return self._spec
