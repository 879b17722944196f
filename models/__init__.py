"""Reference architectures, Fashion-MNIST splits, preprocessing and data sources, the model registry
and head/tail partitioning.

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.models.data import (
        DATA_DIR_ENV,
        DEFAULT_DATA_DIR,
        Dataset,
        Split,
        describe_splits,
        load_split,
        parse_idx,
    )
    from qpart.models.errors import (
        ArrayFileError,
        DatasetError,
        ImageCodecError,
        ImageDecodeError,
        ImageFolderError,
        LabelsError,
        ModelLoadError,
        ModelsError,
        PartitionError,
        PreprocessError,
        RegistryError,
        SampleOverlapError,
        SourceMismatchError,
        UnknownMetricError,
        UnknownModelError,
    )
    from qpart.models.image_codecs import WEBP, decode_webp, encode_webp, parse_rung_id, rung_id, webp_encoder
    from qpart.models.metrics import DEFAULT_METRIC, METRICS, Metric, get_metric, hits_of
    from qpart.models.onnx_export import head_to_onnx
    from qpart.models.partition import Cut, cut_flops, cuts_of, legal_cuts, prepare, split
    from qpart.models.preprocess import (
        FASHION_MNIST_SPEC,
        PreprocessSpec,
        output_size,
        pixel_table,
        preprocess_image,
    )
    from qpart.models.registry import (
        REGISTRY_ENV,
        ZOO_DIR,
        ModelSpec,
        check_labels,
        get_model,
        is_builtin,
        list_models,
        read_registry,
        register_model,
        registry_path,
    )
    from qpart.models.runtimes import distinct_refusals, refusals_by_cut, runtime_refusals
    from qpart.models.sources import (
        ArraySource,
        DataSource,
        FashionMnistSource,
        ImageFolderSource,
        SplitRecord,
        check_sources,
        split_source,
    )
    from qpart.models.timing import interleaved_medians, median_latency
    from qpart.models.training import DEFAULT_IMAGE_FOLDER, train_model

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR",
    "DEFAULT_IMAGE_FOLDER",
    "DEFAULT_METRIC",
    "FASHION_MNIST_SPEC",
    "METRICS",
    "REGISTRY_ENV",
    "WEBP",
    "ZOO_DIR",
    "ArrayFileError",
    "ArraySource",
    "Cut",
    "DataSource",
    "Dataset",
    "DatasetError",
    "FashionMnistSource",
    "ImageCodecError",
    "ImageDecodeError",
    "ImageFolderError",
    "ImageFolderSource",
    "LabelsError",
    "Metric",
    "ModelLoadError",
    "ModelSpec",
    "ModelsError",
    "PartitionError",
    "PreprocessError",
    "PreprocessSpec",
    "RegistryError",
    "SampleOverlapError",
    "SourceMismatchError",
    "Split",
    "SplitRecord",
    "UnknownMetricError",
    "UnknownModelError",
    "check_labels",
    "check_sources",
    "cut_flops",
    "cuts_of",
    "decode_webp",
    "describe_splits",
    "distinct_refusals",
    "encode_webp",
    "get_metric",
    "get_model",
    "head_to_onnx",
    "hits_of",
    "interleaved_medians",
    "is_builtin",
    "legal_cuts",
    "list_models",
    "load_split",
    "median_latency",
    "output_size",
    "parse_idx",
    "parse_rung_id",
    "pixel_table",
    "prepare",
    "preprocess_image",
    "read_registry",
    "refusals_by_cut",
    "register_model",
    "registry_path",
    "rung_id",
    "runtime_refusals",
    "split",
    "split_source",
    "train_model",
    "webp_encoder",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
