"""Reading a data file only when it is a regular file of bounded size: a FIFO, a device or a link
to one is refused before a byte is read, so a hostile folder cannot hang or flood the job."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from qpart.models.errors import ImageDecodeError, ImageFolderError

MAX_FILE_BYTES = 64 << 20
"""The most bytes an image file may hold (64 MiB); a larger one is refused before it is read."""
_READ_BYTES = 1 << 20


def read_regular(path: Path | str, limit: int = MAX_FILE_BYTES, root: Path | str | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes (and, with
    ``root``, one whose real path is inside ``root``'s).

    The file is opened with ``O_NONBLOCK`` (opening a FIFO for reading waits for a writer without
    it) and its type and place are checked on the opened descriptor, so a FIFO or device, or a link
    leading outside ``root``, swapped in after a scan is refused too; at most ``limit + 1`` bytes
    are read, so a file that grows is refused.

    Raises:
        ImageDecodeError: the file is missing or unreadable, not a regular file (a FIFO, a device,
            a link to one), outside ``root`` or larger than ``limit``; the message names it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageDecodeError(
            f"cannot read {path}: {exc.strerror or exc}; fix its permissions or remove it") from exc
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageDecodeError(
                f"{path} is not a regular file ({_kind(info.st_mode)}); only regular image files are "
                f"read: replace it with the image or remove it")
        if root is not None:
            _check_opened_inside(fd, path, root)
        if info.st_size > limit:
            raise ImageDecodeError(_too_large(path, info.st_size, limit))
        chunks = io.BytesIO()
        try:
            while chunk := handle.read(_READ_BYTES):
                chunks.write(chunk)
                if chunks.tell() > limit:
                    raise ImageDecodeError(_too_large(path, chunks.tell(), limit))
        except OSError as exc:
            raise ImageDecodeError(
                f"cannot read {path}: {exc.strerror or exc}; fix its permissions or remove it") from exc
        return chunks.getvalue()


def check_inside(root: Path, path: Path, what: str) -> None:
    """Refuse ``path`` when its real path (links resolved) is outside ``root``'s.

    Raises:
        ImageFolderError: names ``path``, where it leads and how to fix it.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise ImageFolderError(
            f"{what} {path} is a link to {real}, outside the ImageFolder {root}; copy what it holds "
            f"into the folder or remove the link")


def _check_opened_inside(fd: int, path: Path | str, root: Path | str) -> None:
    """Refuse the opened ``fd`` of ``path`` unless the file it holds is inside ``root``: the
    descriptor's own path where the system shows it (``/proc/self/fd``), else ``path``'s real path
    once opened (a link swapped in after the scan is followed by both)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
    real_root = os.path.realpath(root)
    if not os.path.isabs(real) or os.path.commonpath([real_root, real]) != real_root:
        raise ImageDecodeError(
            f"{path} leads to {real}, outside the ImageFolder {root} (a link swapped in after the "
            "scan?); copy what it holds into the folder or remove the link")


def _too_large(path: Path | str, size: int, limit: int) -> str:
    return (f"{path} holds {size} bytes or more, more than the {limit} an image file may hold; "
            "downscale or remove it")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")
