"""The device runtime and its command line: plan, fetch the head segment, run it, upload the
activation (docs/guide/devices.md).

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.client.cli import device_app
    from qpart.client.device import InferenceRun
    from qpart.client.errors import (
        AnswerTooLargeError,
        DeviceError,
        DeviceInputError,
        ForeignOriginError,
        HeadDeadlineError,
        SegmentError,
        SegmentRefusedError,
        ServerAnswerError,
        ServerRejectedError,
        ServerUnavailableError,
        TransferDeadlineError,
    )
    from qpart.client.inputs import read_idx_images, read_idx_labels, read_image_files, read_labels
    from qpart.client.onnx_runtime import OnnxDeviceRuntime
    from qpart.client.profiler import profile_device
    from qpart.client.runtime import DeviceRuntime
    from qpart.client.settings import DeviceSettings

__all__ = [
    "AnswerTooLargeError",
    "DeviceError",
    "DeviceInputError",
    "DeviceRuntime",
    "DeviceSettings",
    "ForeignOriginError",
    "HeadDeadlineError",
    "InferenceRun",
    "OnnxDeviceRuntime",
    "SegmentError",
    "SegmentRefusedError",
    "ServerAnswerError",
    "ServerRejectedError",
    "ServerUnavailableError",
    "TransferDeadlineError",
    "device_app",
    "profile_device",
    "read_idx_images",
    "read_idx_labels",
    "read_image_files",
    "read_labels",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
