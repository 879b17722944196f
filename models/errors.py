"""Exception tree of the ``models`` package.

::

    ModelsError
    ├── DatasetError            the dataset is missing or its files are malformed
    ├── UnknownModelError       a model name that is not registered
    ├── ModelLoadError          weights file missing, unreadable or not matching the architecture
    └── PartitionError          a cut index outside the legal cuts, or a graph that cannot be traced
"""

from __future__ import annotations


class ModelsError(Exception):
    """Base class of every error raised by :mod:`models`."""


class DatasetError(ModelsError):
    """The dataset files are missing, truncated or not IDX files."""


class UnknownModelError(ModelsError, KeyError):
    """A model name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown model"


class ModelLoadError(ModelsError):
    """A weights file that is missing, unreadable or does not fit the architecture."""


class PartitionError(ModelsError):
    """A cut that is not legal for the model, or a model torch.fx cannot trace."""
