"""Exception tree of the ``offline`` package.

::

    CalibrationError
    ├── CalibrationConfigError     settings that cannot work (levels out of range, too few samples)
    ├── InfeasibleLevelError       no pattern, not even the lossless one, meets a level
    └── WorkerError                a validation worker process could not start or died
"""

from __future__ import annotations


class CalibrationError(Exception):
    """Base class of every error raised by :mod:`offline`."""


class CalibrationConfigError(CalibrationError, ValueError):
    """Calibration settings that cannot produce a valid artifact."""


class InfeasibleLevelError(CalibrationError):
    """A level that even the lossless pattern cannot meet under the validation bound."""


class WorkerError(CalibrationError):
    """A worker process of the validation stage failed to start (its reason) or died."""
