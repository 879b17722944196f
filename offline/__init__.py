"""The calibration job: noise tables, bit allocation, accuracy certification and the artifact it
writes (docs/guide/calibration.md).

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.offline.coding import measure_artifact
    from qpart.offline.errors import (
        CalibrationConfigError,
        CalibrationError,
        CalibrationOutputError,
        CheckpointMismatchError,
        ExecutorError,
        InfeasibleLevelError,
        WorkerError,
    )
    from qpart.offline.image_ladder import measure_artifact_images
    from qpart.offline.job import ProgressSink, calibrate
    from qpart.offline.settings import CalibrationSettings, Estimator, SampleOrder
    from qpart.offline.sizing import percent

__all__ = [
    "CalibrationConfigError",
    "CalibrationError",
    "CalibrationOutputError",
    "CalibrationSettings",
    "CheckpointMismatchError",
    "Estimator",
    "ExecutorError",
    "InfeasibleLevelError",
    "ProgressSink",
    "SampleOrder",
    "WorkerError",
    "calibrate",
    "measure_artifact",
    "measure_artifact_images",
    "percent",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
