"""Exception tree of the ``offline`` package.

::

    CalibrationError
    ├── CalibrationConfigError     settings that cannot work (levels out of range, too few samples)
    │   └── CheckpointMismatchError   the output folder's checkpoints are of other inputs, or edited
    ├── CalibrationOutputError     the output folder cannot be written (permissions, a full disk)
    ├── InfeasibleLevelError       no pattern, not even the lossless one, meets a level
    ├── WorkerError                a validation worker process could not start or died
    └── ExecutorError              the Ray cluster is missing, unreachable, or went away
"""

from __future__ import annotations


class CalibrationError(Exception):
    """Base class of every error raised by :mod:`offline`."""


class CalibrationConfigError(CalibrationError, ValueError):
    """Calibration settings that cannot produce a valid artifact."""


class CheckpointMismatchError(CalibrationConfigError):
    """The output folder holds checkpoints of a job with other inputs (model, data, settings), or a
    checkpoint that is not one the job wrote: not JSON, or edited since (its sha256 seal fails)."""


class CalibrationOutputError(CalibrationError):
    """An output or checkpoint file could not be written; the checkpoints already there stay valid."""


class InfeasibleLevelError(CalibrationError):
    """A level that even the lossless pattern cannot meet under the validation bound."""


class WorkerError(CalibrationError):
    """A worker process of the validation stage failed to start (its reason) or died."""


class ExecutorError(CalibrationError):
    """The executor the job was given cannot run it: Ray missing, its cluster unreachable or gone."""
