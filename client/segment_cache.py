"""The device's on-disk segment cache: content-addressed, resumable, verified before first use.

``<id>.seg`` files are complete and verified (their sha256 is their name); downloads go to
``<id>.part`` and are renamed only when complete and verified, so a crash never leaves a file
that looks usable. An interrupted download resumes with ``Range``; a cached file is revalidated
with ``If-None-Match`` and re-hashed before use, and a corrupt one is deleted and fetched again.
Pruning removes the least recently used files beyond the size limit; ``.part`` files count in it
and go first, so a partial download never evicts a good segment. A download that fails for any
reason but a lost connection (which it resumes from) deletes its ``.part`` file; one starting
deletes every other segment's, so at most one is kept to resume; and one left by a crash
(untouched for :data:`PART_STALE_S`) is deleted when the cache opens. A download is held to one
overall deadline (``transfer_deadline_s`` plus its announced size at ``transfer_min_rate_bps``)
for all its attempts and the waits between them, and its decoded bytes are counted against its
bound.

A segment is held to the size its plan announced and to the device's cap, if it has one: one
announced over the cap is refused before a byte is downloaded, and a download whose
Content-Length or received bytes go past either is stopped and refused (:class:`SegmentRefusedError`),
its ``.part`` file deleted. A download that ends short of the announced size is truncated
(:class:`SegmentError`), and its ``.part`` file is deleted too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from qpart.client.errors import (
    SegmentError,
    SegmentRefusedError,
    ServerRejectedError,
    ServerUnavailableError,
    TransferDeadlineError,
)
from qpart.client.transport import Transport, iter_decoded, one_line

PART_STALE_S = 600.0
"""A ``.part`` file untouched this long is no download in progress (every write touches it, and a
read waits ``timeout_s`` at most): one a crash left behind, deleted when the cache opens."""

Progress = Callable[[int, int], None]
Check = Callable[[bytes], None]
"""A check a segment's bytes must pass before the cache keeps or returns them; it raises
:class:`SegmentRefusedError`."""


@dataclass(frozen=True)
class CachedSegment:
    """One complete segment file."""

    segment_id: str
    size_bytes: int
    last_used: float


@dataclass(frozen=True)
class Fetched:
    """A segment's bytes and what obtaining them cost."""

    data: bytes
    downloaded_bytes: int
    from_cache: bool


@dataclass(frozen=True)
class _Bound:
    """The most bytes a segment may have: the size its plan announced and the device's cap."""

    segment_id: str
    announced: int | None
    cap: int | None
    raise_cap: str = "OnnxSegmentLimits(max_bytes=...)"
    """How the user raises :attr:`cap` (named in the refusal)."""

    @property
    def most(self) -> int | None:
        known = [n for n in (self.announced, self.cap) if n is not None]
        return min(known) if known else None

    def refusal(self, how: str, size: int, kept: str = "nothing of it was kept") -> SegmentRefusedError:
        """The one-line refusal of ``size`` bytes (``how``: who says so), which exceed the bound."""
        if self.cap is not None and size > self.cap:
            over = f"over this device's cap of {self.cap} bytes (raise it with {self.raise_cap})"
        else:
            over = f"more than the {self.announced} bytes the plan announced"
        return SegmentRefusedError(f"segment {self.segment_id[:12]} refused: {how} {size} bytes, {over}; "
                                   f"{kept}")


class _Retry(ServerUnavailableError):
    """A retryable answer (503/429/…) with the server's Retry-After."""

    def __init__(self, message: str, retry_after: str | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SegmentCache:
    """Segment files under ``root``, at most ``max_bytes`` in total."""

    def __init__(self, root: Path, max_bytes: int, transport: Transport) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.transport = transport
        root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_parts(PART_STALE_S)

    def _remove_stale_parts(self, age_s: float) -> None:
        before = time.time() - age_s
        for stale in self.root.glob("*.part"):
            with contextlib.suppress(FileNotFoundError):  # another process finished or removed it
                if stale.stat().st_mtime < before:
                    stale.unlink(missing_ok=True)

    def _file(self, segment_id: str) -> Path:
        if len(segment_id) != 64 or any(c not in "0123456789abcdef" for c in segment_id):
            raise SegmentError(f"'{segment_id}' is not a sha256 segment id")
        return self.root / f"{segment_id}.seg"

    def _verified(self, path: Path, segment_id: str, check: Check | None = None) -> bytes | None:
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == segment_id:
            if check is not None:
                try:
                    check(data)
                except SegmentRefusedError:
                    path.unlink(missing_ok=True)  # caps may have tightened since: never keep it
                    raise
            return data
        path.unlink(missing_ok=True)  # corrupt or truncated: never load it, fetch again
        return None

    def get(self, segment_id: str, url: str, *, revalidate: bool = True,
            progress: Progress | None = None, check: Check | None = None,
            size_bytes: int | None = None, max_bytes: int | None = None,
            raise_cap: str = "OnnxSegmentLimits(max_bytes=...)") -> Fetched:
        """The verified bytes of a segment, from disk or the server; with ``check``, bytes that
        fail it are deleted and :class:`SegmentRefusedError` raised, so they are never cached.

        ``size_bytes`` is the size the plan announced and ``max_bytes`` the device's cap (None:
        none): a segment announced over the cap is refused before anything is downloaded, and a
        download that goes past either is stopped and refused; neither leaves a file behind."""
        path = self._file(segment_id)
        bound = _Bound(segment_id, size_bytes, max_bytes, raise_cap)
        if size_bytes is not None and max_bytes is not None and size_bytes > max_bytes:
            path.unlink(missing_ok=True)  # the cap may have tightened since it was cached
            (self.root / f"{segment_id}.part").unlink(missing_ok=True)
            raise bound.refusal("the plan announces", size_bytes, "nothing was downloaded")
        if path.is_file():
            data = self._verified(path, segment_id, check)
            if data is not None and (not revalidate or self._still_valid(segment_id, url)):
                os.utime(path)
                return Fetched(data, 0, True)
        deadline = self.transport.deadline(bound.most or 0)  # one for both tries below
        resumed = (self.root / f"{segment_id}.part").is_file()
        try:
            downloaded = self._download(segment_id, url, progress, check, bound, deadline)
        except SegmentRefusedError:
            raise
        except SegmentError:
            if not resumed:
                raise  # a whole download that is wrong: the server's bytes, not a stale part
            # A resumed file that fails its hash (the old part was stale): once more from zero.
            downloaded = self._download(segment_id, url, progress, check, bound, deadline)
        data = self._verified(path, segment_id)
        if data is None:
            raise SegmentError(f"segment {segment_id[:12]} failed verification after download")
        self.prune(keep=segment_id)
        return Fetched(data, downloaded, False)

    def _still_valid(self, segment_id: str, url: str) -> bool:
        """Whether the server still serves the cached segment as it is: a conditional HEAD, so
        that a server answering 200 instead of 304 sends no body (the download then is bounded)."""
        response = self.transport.request("HEAD", url, segment=True,
                                          headers={"If-None-Match": f'"{segment_id}"'})
        return response.status_code == 304

    def _download(self, segment_id: str, url: str, progress: Progress | None, check: Check | None,
                  bound: _Bound, deadline: float) -> int:
        part = self.root / f"{segment_id}.part"
        for other in self.root.glob("*.part"):
            if other != part:  # only this download's part is kept to resume: no pile beyond the budget
                other.unlink(missing_ok=True)
        try:
            total_read = self._download_part(part, url, progress, bound, deadline)
        except TransferDeadlineError:
            part.unlink(missing_ok=True)
            raise
        except ServerUnavailableError:
            raise  # the connection was lost: the part stays for the next run to resume (Range)
        except BaseException:
            part.unlink(missing_ok=True)  # refused, rejected, disk full...: nothing of it stays
            raise
        size = part.stat().st_size
        if bound.announced is not None and size < bound.announced:
            part.unlink(missing_ok=True)
            raise SegmentError(f"downloaded segment {segment_id[:12]} is truncated: {size} of "
                               f"{bound.announced} bytes; the partial file was deleted, retry")
        if hashlib.sha256(part.read_bytes()).hexdigest() != segment_id:
            part.unlink(missing_ok=True)
            raise SegmentError(f"downloaded segment {segment_id[:12]} does not match its sha256: the "
                               "server sent other bytes than its plan names; refused, nothing kept")
        if check is not None:
            try:
                check(part.read_bytes())
            except SegmentRefusedError:
                part.unlink(missing_ok=True)  # refused: nothing of it stays, not even to resume
                raise
        os.replace(part, self._file(segment_id))
        return total_read

    def _download_part(self, part: Path, url: str, progress: Progress | None, bound: _Bound,
                       deadline: float) -> int:
        """Stream the segment into ``part`` (resuming it), with retries, all of them and the waits
        between them within ``deadline`` (per attempt, retries would multiply it); the bytes read."""
        settings = self.transport.settings
        total_read = 0
        last_error = ""
        for attempt in range(settings.retries + 1):
            retry_after: str | None = None
            try:
                total_read += self._stream_once(part, url, progress, bound, deadline)
                return total_read
            except TransferDeadlineError:  # never retried: that would only multiply the wait
                raise TransferDeadlineError(
                    f"download of segment {bound.segment_id[:12]} outlived its deadline "
                    "(QPART_DEVICE_TRANSFER_DEADLINE_S); the server sends too slowly") from None
            except _Retry as exc:
                last_error, retry_after = str(exc), exc.retry_after
            except (httpx.TransportError, ServerUnavailableError) as exc:
                last_error = str(exc)
            if attempt < settings.retries:
                wait = self.transport.backoff(attempt, retry_after)
                if time.monotonic() + wait >= deadline:  # never wait past it, for a retry cut short
                    raise TransferDeadlineError(
                        f"download of segment {bound.segment_id[:12]} outlived its deadline "
                        f"(QPART_DEVICE_TRANSFER_DEADLINE_S) after {attempt + 1} attempts; "
                        f"last: {one_line(last_error)}")
                time.sleep(wait)
        raise ServerUnavailableError(f"download of segment {bound.segment_id[:12]} failed: {last_error}")

    def _stream_once(self, part: Path, url: str, progress: Progress | None, bound: _Bound,
                     deadline: float) -> int:
        most = bound.most
        offset = part.stat().st_size if part.is_file() else 0
        if most is not None and offset > most:
            part.unlink(missing_ok=True)  # a stale part longer than the segment can be: from zero
            offset = 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        started = time.perf_counter()
        read = 0
        with self.transport.stream(url, headers, deadline) as response:
            if response.status_code == 416:
                part.unlink(missing_ok=True)
                raise ServerUnavailableError("stale partial download; restarting from zero")
            if response.status_code in (429, 502, 503, 504):
                raise _Retry(f"server answered {response.status_code}", response.headers.get("retry-after"))
            if response.status_code == 206 and not response.headers.get(
                    "content-range", "").startswith(f"bytes {offset}-"):
                part.unlink(missing_ok=True)  # not the range we asked for: never splice it in
                raise ServerUnavailableError("unexpected Content-Range; restarting from zero")
            if response.status_code >= 400:
                raise ServerRejectedError(response.status_code, _head_of(response, deadline))
            mode = "ab" if response.status_code == 206 else "wb"
            done = offset if mode == "ab" else 0
            total = done + _content_length(response)
            if most is not None and total > most:  # refused before a byte of the body is read
                raise bound.refusal("the server's Content-Length makes it", total)
            with part.open(mode) as handle:
                for chunk in iter_decoded(response, deadline, f"download of segment {bound.segment_id[:12]}"):
                    handle.write(chunk)
                    read += len(chunk)
                    done += len(chunk)
                    if most is not None and done > most:
                        raise bound.refusal("the server sent at least", done)
                    if progress:
                        progress(done, total)
                handle.flush()
                os.fsync(handle.fileno())
        self.transport.rate.add(read, time.perf_counter() - started)
        return read

    def discard(self, segment_id: str) -> None:
        """Delete a segment's file and any partial download of it (one that passed the checks but
        that its runtime then refused: it must not be served from the cache again)."""
        self._file(segment_id).unlink(missing_ok=True)
        (self.root / f"{segment_id}.part").unlink(missing_ok=True)

    def part_bytes(self) -> int:
        """Bytes held by partial downloads (they count in the cache's size limit)."""
        total = 0
        for part in self.root.glob("*.part"):
            with contextlib.suppress(FileNotFoundError):  # finished or removed meanwhile
                total += part.stat().st_size
        return total

    def entries(self) -> list[CachedSegment]:
        """Complete segment files, least recently used first."""
        found = [CachedSegment(p.stem, p.stat().st_size, p.stat().st_mtime) for p in self.root.glob("*.seg")]
        return sorted(found, key=lambda e: e.last_used)

    def prune(self, keep: str | None = None, max_bytes: int | None = None) -> list[str]:
        """Delete partial downloads (but ``keep``'s), then least recently used segments, until the
        total fits; returns deleted segment ids (a part never costs a good segment its place)."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        self._remove_stale_parts(PART_STALE_S)
        entries = self.entries()
        total = sum(e.size_bytes for e in entries) + self.part_bytes()
        for part in sorted(self.root.glob("*.part")):
            if total > limit and part.stem != keep:
                with contextlib.suppress(FileNotFoundError):  # finished or removed meanwhile
                    total -= part.stat().st_size
                    part.unlink()
        removed = []
        for e in entries:
            if total <= limit:
                break
            if e.segment_id == keep:
                continue
            (self.root / f"{e.segment_id}.seg").unlink(missing_ok=True)
            total -= e.size_bytes
            removed.append(e.segment_id)
        return removed


def _head_of(response: httpx.Response, deadline: float) -> str:
    """The first 300 characters of an error answer (the rest is never read)."""
    body = bytearray()
    for chunk in iter_decoded(response, deadline, "an error answer"):
        body += chunk
        if len(body) >= 300:
            break
    return body[:300].decode("utf-8", "replace")


def _content_length(response: httpx.Response) -> int:
    """The answer's Content-Length (0 when it has none or one that is not a number)."""
    try:
        return max(0, int(response.headers.get("content-length", 0)))
    except ValueError:
        return 0
