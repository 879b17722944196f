"""The calibration and test data sources: named sources opened with the model's card, checked
against each other and the model, with the sample order the job reads them in
(``offline.samples`` reads and holds the samples).

A SOURCE is ``fashion-mnist`` (``fashion-mnist:<split>`` names a split; plain, it is the
``calibration`` split for calibration and ``test`` for testing), a folder (an ImageFolder,
preprocessed by the card's spec) or an ``.npz`` / ``.safetensors`` file of preprocessed tensors.
The sample order is ``source`` for Fashion-MNIST and ``digest`` for other sources unless the
settings name one (:mod:`offline.samples`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from qpart.models.data import Split
from qpart.models.errors import LabelsError, SourceMismatchError
from qpart.models.metrics import DEFAULT_METRIC, get_metric
from qpart.models.preprocess import PreprocessSpec
from qpart.models.registry import ModelSpec
from qpart.models.sources import (
    ArraySource,
    DataSource,
    FashionMnistSource,
    ImageFolderSource,
    check_sources,
    split_source,
)
from qpart.models.sources.base import SplitRecord
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.settings import CalibrationSettings, SampleOrder
from qpart.profiles.artifacts import CalibrationArtifact

FASHION = "fashion-mnist"
ARRAY_SUFFIXES = (".npz", ".safetensors")


@dataclass(frozen=True)
class Sources:
    """The calibration source and the test source of one job, checked to be usable together."""

    calibration: DataSource
    test: DataSource
    order: SampleOrder


def open_source(text: str, spec: ModelSpec, role: Literal["calibration", "test"]) -> DataSource:
    """The source a ``--data`` / ``--test-data`` value names (module docstring).

    Raises:
        CalibrationConfigError: not a known name, an existing folder or an array file.
        ModelsError: the source cannot be read (its own one-line errors).
    """
    if text == FASHION or text.startswith(f"{FASHION}:"):
        name = text.partition(":")[2] or role
        if name not in {s.value for s in Split}:
            raise CalibrationConfigError(f"data source {text!r}: the Fashion-MNIST splits are "
                                         f"{', '.join(s.value for s in Split)}")
        return FashionMnistSource(Split(name), spec=spec.preprocess)
    path = Path(text)
    if path.is_dir():
        preprocess = spec.preprocess
        if preprocess is None:
            raise CalibrationConfigError(
                f"'{spec.name}' declares no preprocessing, so the images in {path} cannot become its "
                f"inputs; register it with --preprocess-file or --color/--mean/--std")
        return ImageFolderSource(path, preprocess)
    if path.suffix.lower() in ARRAY_SUFFIXES and path.is_file():
        return ArraySource(path)
    raise CalibrationConfigError(
        f"data source {text!r} is neither {FASHION}, an existing folder (an ImageFolder) nor an existing "
        f"{'/'.join(ARRAY_SUFFIXES)} file")


def open_sources(spec: ModelSpec, s: CalibrationSettings) -> Sources:
    """The job's calibration and test sources, from ``data`` and ``test_data`` or a seeded split.

    Raises:
        CalibrationConfigError: no test source can be chosen, or both ways were given.
        SourceMismatchError, SampleOverlapError: the two sources cannot be used together.
    """
    calibration = open_source(s.data, spec, "calibration")
    if s.test_data is not None and s.test_fraction is not None:
        raise CalibrationConfigError("give a test source (--test-data) or a test fraction, not both")
    if s.test_fraction is not None:
        count = round(len(calibration) * s.test_fraction)
        parts = split_source(calibration, test_count=min(max(count, 1), len(calibration) - 1),
                             seed=s.split_seed)
        calibration, test = parts.calibration, parts.test
    elif s.test_data is not None:
        test = open_source(s.test_data, spec, "test")
    elif isinstance(calibration, FashionMnistSource):
        test = open_source(FASHION, spec, "test")
    else:
        raise CalibrationConfigError(f"{s.data} needs a test source: give --test-data SOURCE, or "
                                     f"--test-fraction F (and --split-seed S) to split it")
    check_sources(calibration, test)
    order: SampleOrder = s.sample_order or ("source" if isinstance(calibration, FashionMnistSource)
                                            else "digest")
    return Sources(calibration, test, order)


def align_labels(spec: ModelSpec, sources: Sources, mode: Literal["check", "map"]) -> Sources:
    """``sources`` checked against the card's labels: where the card names the data's classes in
    another order, refused (``check``: every answer would be named wrongly on devices) or the
    data's classes renumbered into the card's order (``map``). Other names, or none, pass as they
    are (they cannot be compared: an array file's classes are ``0``, ``1``, ...).

    Raises:
        LabelsError: the same names in another order, and ``mode`` is ``check``.
    """
    labels, classes = spec.labels, sources.calibration.class_names
    if (labels is None or not sources.calibration.labelled or tuple(labels) == tuple(classes)
            or sorted(labels) != sorted(classes)):
        return sources
    if mode == "check":
        raise LabelsError(
            f"the card of '{spec.name}' names its labels in the order {', '.join(labels)} but the data's "
            f"classes are {', '.join(classes)}; give --labels map to renumber the data's classes into the "
            "card's order, or register the model with its labels in the data's order")
    return replace(sources, calibration=sources.calibration.in_class_order(labels),
                   test=_ordered(sources.test, labels))


def _ordered(source: DataSource, labels: Sequence[str]) -> DataSource:
    """``source`` in the card's class order where it holds the same classes (else as it is: the
    calibration and test sources were checked to agree, ``check_sources``)."""
    return (source.in_class_order(labels) if source.labelled and sorted(source.class_names) == sorted(labels)
            else source)


def check_metric_fits(sources: Sources, metric: str) -> None:
    """Refuse a metric that needs labels on a source without them, before any work.

    Raises:
        LabelsError: one line naming the source and the metric that needs no labels.
    """
    if not get_metric(metric).needs_labels:
        return
    for role, source in (("calibration", sources.calibration), ("test", sources.test)):
        if not source.labelled:
            raise LabelsError(f"the {role} data {source.describe().location} has no labels (no class "
                              f"folders, or no y), which the {metric} metric needs; give --metric "
                              "top1-agreement (its promise needs no labels) or labelled data")


def check_model_fits(spec: ModelSpec, sources: Sources, logits: int, metric: str = DEFAULT_METRIC) -> None:
    """Refuse data whose samples the model does not take, or, for a ``metric`` that reads labels,
    whose classes are not one per logit, and a card whose labels are not one per logit.

    Raises:
        SourceMismatchError: the samples' shape is not the model's input shape.
        LabelsError: classes or labels that are not one per logit.
    """
    shape = sources.calibration.sample_shape
    if tuple(shape) != tuple(spec.input_shape):
        raise SourceMismatchError(
            f"the data's samples are {list(shape)} but '{spec.name}' takes {list(spec.input_shape)}; "
            f"declare its preprocessing when registering it, or give data of that shape")
    classes = len(sources.calibration.class_names)
    if sources.calibration.labelled and get_metric(metric).needs_labels and classes != logits:
        raise LabelsError(f"the data has {classes} classes but '{spec.name}' gives {logits} logits; give "
                          f"data with one class per logit")
    labels = spec.labels
    if labels is not None and len(labels) != logits:
        raise LabelsError(f"the card of '{spec.name}' names {len(labels)} labels but the model gives "
                          f"{logits} logits; register it with one label per logit")


def recorded_source(artifact: CalibrationArtifact, spec: ModelSpec, role: Literal["calibration", "test"],
                    data: str | None = None) -> DataSource:
    """The ``role`` source an artifact records, reopened: from ``data`` (where it is now, as
    ``qpart calibrate --data`` / ``--test-data`` named it; for a split source, the source before
    the split) or where it was read, and checked against the recorded content digest.

    Raises:
        CalibrationConfigError: the artifact records no data, or the source holds other content.
    """
    if artifact.data is None:
        raise CalibrationConfigError(f"{artifact.model}'s artifact records no data sources (calibrated "
                                     "before schema 4); calibrate it again")
    recorded = artifact.data.calibration if role == "calibration" else artifact.data.test
    split = SplitRecord.model_validate(recorded.split) if recorded.split is not None else None
    text = data or recorded.location
    source: DataSource
    if data is None and recorded.kind == "fashion-mnist":  # the built-in split, as many as it read
        split_name = recorded.location.partition("@")[0].partition(":")[2]
        preprocess = PreprocessSpec.from_mapping(recorded.preprocess) if recorded.preprocess else None
        read = recorded.count if split is None else split.parent_count  # a split source: its parent
        source = FashionMnistSource(Split(split_name), limit=read, spec=preprocess)
    else:
        source = open_source(text, spec, role)
    if split is not None:
        if source.content_sha256() != split.parent_sha256:
            raise CalibrationConfigError(
                f"{text} is not the source the artifact's {role} samples were split from (content "
                f"sha256 differs); give the source calibrate split")
        parts = split_source(source, test_count=split.parent_count - split.count, seed=split.seed)
        source = parts.calibration if split.part == "calibration" else parts.test
    if artifact.settings.get("labels") == "map" and spec.labels is not None:  # as the job renumbered it
        source = _ordered(source, spec.labels)
    if source.content_sha256() != recorded.content_sha256:
        raise CalibrationConfigError(
            f"{text} does not hold the data {artifact.model} was calibrated on (content sha256 differs "
            f"from the artifact's); give where that data is now")
    return source
