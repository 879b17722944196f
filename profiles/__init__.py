"""Typed, versioned data contracts and their files: device profiles and calibration artifacts.

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.profiles.artifacts import (
        ARTIFACT_FILE,
        FLOAT_BITS,
        AccuracyPoint,
        CalibrationArtifact,
        CalibrationData,
        CutProfile,
        DataRecord,
        ImageLadder,
        ImageRung,
        Pattern,
        Promise,
        WeightTensor,
        load_artifact,
        save_artifact,
        write_atomic,
    )
    from qpart.profiles.cut_choice import CutChoice
    from qpart.profiles.devices import (
        DeviceProfile,
        MeasuredHeads,
        get_device,
        load_device_profile,
        save_device_profile,
    )
    from qpart.profiles.errors import (
        ProfileError,
        ProfileFormatError,
        ProfileNotFoundError,
        SchemaVersionError,
    )

__all__ = [
    "ARTIFACT_FILE",
    "FLOAT_BITS",
    "AccuracyPoint",
    "CalibrationArtifact",
    "CalibrationData",
    "CutChoice",
    "CutProfile",
    "DataRecord",
    "DeviceProfile",
    "ImageLadder",
    "ImageRung",
    "MeasuredHeads",
    "Pattern",
    "ProfileError",
    "ProfileFormatError",
    "ProfileNotFoundError",
    "Promise",
    "SchemaVersionError",
    "WeightTensor",
    "get_device",
    "load_artifact",
    "load_device_profile",
    "save_artifact",
    "save_device_profile",
    "write_atomic",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
