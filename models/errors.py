"""Exception tree of the ``models`` package.

::

    ModelsError
    ├── DatasetError            the dataset is missing or its files are malformed
    │   ├── ImageFolderError    an ImageFolder with no class folders, a class with no images, or a
    │   │                       link that leads out of its root
    │   ├── ImageDecodeError    an image file that cannot be read or decoded, is not a regular file
    │   │                       or is over the size cap (the message names it)
    │   ├── ArrayFileError      an .npz or safetensors file without x/y, or with bad dtypes or shapes
    │   ├── SourceMismatchError calibration and test sources whose class names differ
    │   └── SampleOverlapError  calibration and test sources sharing a sample (equal digests)
    ├── PreprocessError         a preprocessing spec that is invalid or does not fit an image or the model
    ├── ImageCodecError         an image the input-image codec cannot encode (a quality outside 1..100,
    │                           a side over WebP's 16,383 pixels)
    ├── LabelsError             label names that are malformed, or not one per logit or per class
    ├── UnknownModelError       a model name that is not registered
    ├── ModelLoadError          weights file missing, unreadable or not matching the architecture
    │   └── RegistryError       a registry file that is malformed, lists a name twice or names a
    │                           built-in model (a registry cannot replace one)
    └── PartitionError          a cut index outside the legal cuts, or a graph that cannot be traced
"""

from __future__ import annotations


class ModelsError(Exception):
    """Base class of every error raised by :mod:`models`."""


class DatasetError(ModelsError):
    """The dataset files are missing, truncated or not in the format they claim."""


class ImageFolderError(DatasetError):
    """An ImageFolder without class folders, with a class folder holding no image, or with a link
    (a class folder or an image) whose real path is outside the folder's root."""


class ImageDecodeError(DatasetError):
    """An image file that Pillow cannot open or decode, one too large to decode, or one that is not
    a regular file (a FIFO, a device, a link to one) or is over the per-file size cap."""


class ArrayFileError(DatasetError):
    """An array file (``.npz``, safetensors) missing ``x`` or ``y``, or with bad dtypes or shapes."""


class SourceMismatchError(DatasetError):
    """A calibration source and a test source with different class names."""


class SampleOverlapError(DatasetError):
    """A calibration source and a test source that share a sample (equal sha256 digests)."""


class PreprocessError(ModelsError):
    """A preprocessing spec that is invalid (e.g. mean/std of the wrong length) or that an image
    does not fit (e.g. smaller than the center crop)."""


class LabelsError(ModelsError):
    """Label names that are malformed (empty, repeated), or whose count is not the model's logits
    or the data's classes."""


class UnknownMetricError(ModelsError):
    """A metric name no module of :mod:`qpart.models.metrics` registers."""


class UnknownModelError(ModelsError, KeyError):
    """A model name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown model"


class ModelLoadError(ModelsError):
    """A weights file that is missing, unreadable or does not fit the architecture."""


class RegistryError(ModelLoadError):
    """A model registry file (``$QPART_MODEL_REGISTRY``) that is malformed, lists a name twice or
    gives a name ``qpart models register`` refuses, such as a built-in model's: the file is refused
    as a whole, never merged over the built-in models."""


class PartitionError(ModelsError):
    """A cut that is not legal for the model, or a model torch.fx cannot trace."""


class ImageCodecError(ModelsError, ValueError):
    """An image :mod:`models.image_codecs` cannot encode: a quality outside 1..100, or a side over
    WebP's 16,383 pixels."""
