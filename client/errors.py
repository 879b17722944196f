"""Exception tree of the ``client`` package (the device runtime).

::

    DeviceError
    ├── ServerRejectedError      the server answered 4xx: the request must change (message from server)
    ├── ServerUnavailableError   5xx, 429 or connection failures that outlived the retries
    │   └── TransferDeadlineError  a transfer that outlived its overall deadline (a server that drips)
    ├── ServerAnswerError        a plan or answer this client cannot read (client and server disagree)
    │   ├── AnswerTooLargeError  an answer over the byte cap once decoded (a bomb, an endless body)
    │   └── ForeignOriginError   a plan that sends the device to another origin it does not trust (ADR 0020)
    ├── SegmentError             a segment that fails its sha256, is truncated or does not fit the head
    │   ├── SegmentRefusedError  a segment that fails the device's check before it runs (never cached)
    │   └── HeadDeadlineError    a head that ran past its deadline (the segment is evicted, ADR 0020)
    └── DeviceInputError         an input file that cannot be read as an image or IDX file
"""

from __future__ import annotations

CACHE_HEALED = "the cached copy was deleted and the next run downloads it again"
"""What a :class:`SegmentError` adds when the segment that failed to load or run was deleted from
the device's cache (it is then never announced as held again)."""


class DeviceError(Exception):
    """Base class of every error raised by :mod:`client`."""


class ServerRejectedError(DeviceError):
    """The server refused the request (4xx); its message says what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"server refused the request ({status}): {message}")
        self.status = status


class ServerUnavailableError(DeviceError):
    """The server could not be reached or stayed overloaded through every retry."""


class ServerAnswerError(DeviceError):
    """The server's plan or answer lacks a field this client needs, or holds one it cannot read."""


class TransferDeadlineError(ServerUnavailableError):
    """A transfer went on past its overall deadline (``transfer_deadline_s``); it is not retried."""


class AnswerTooLargeError(ServerAnswerError):
    """An answer grew past ``answer_max_bytes`` once decoded; nothing more of it was read."""


class ForeignOriginError(ServerAnswerError):
    """A plan names a URL on another origin than the server's (scheme, host, port) that the device
    does not trust: credentials and activations go to the server's own origin only (ADR 0020)."""


class SegmentError(DeviceError):
    """A downloaded or cached segment is corrupt or does not match the model's head."""


class SegmentRefusedError(SegmentError):
    """A segment the device will not run (an ONNX segment outside its allow-list or caps); the
    cache never keeps it, and downloading it again would not help."""


class HeadDeadlineError(SegmentError):
    """An ONNX head run went on past its deadline (``head_deadline_s`` plus its estimated work at
    ``head_min_flops_per_s``): it was stopped, or its output refused; its segment was deleted from
    the cache, so a later run does not hang on it again (ADR 0020)."""


class DeviceInputError(DeviceError):
    """An input that cannot be read."""
