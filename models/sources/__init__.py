"""Data sources behind one interface: an ImageFolder, preprocessed arrays, built-in Fashion-MNIST.

See ``docs/data-sources.md`` for the formats, the order of samples and the errors.
"""

from qpart.models.sources.base import Batch, DataSource, SourceKind, SourceRecord, SplitRecord
from qpart.models.sources.folder import IMAGE_EXTENSIONS, ImageFolderSource, find_classes

__all__ = [
    "IMAGE_EXTENSIONS",
    "Batch",
    "DataSource",
    "ImageFolderSource",
    "SourceKind",
    "SourceRecord",
    "SplitRecord",
    "find_classes",
]
