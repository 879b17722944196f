"""Data sources behind one interface: an ImageFolder, preprocessed arrays, built-in Fashion-MNIST.

See ``docs/data-sources.md`` for the formats, the order of samples and the errors.
"""

from qpart.models.sources.arrays import ArraySource
from qpart.models.sources.base import Batch, DataSource, SourceKind, SourceRecord, SplitRecord
from qpart.models.sources.fashion import FashionMnistSource, class_folder_names, export_image_folder
from qpart.models.sources.folder import IMAGE_EXTENSIONS, ImageFolderSource, find_classes
from qpart.models.sources.splits import SourceSplit, check_sources, split_source

__all__ = [
    "IMAGE_EXTENSIONS",
    "ArraySource",
    "Batch",
    "DataSource",
    "FashionMnistSource",
    "ImageFolderSource",
    "SourceKind",
    "SourceRecord",
    "SourceSplit",
    "SplitRecord",
    "check_sources",
    "class_folder_names",
    "export_image_folder",
    "find_classes",
    "split_source",
]
