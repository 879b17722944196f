"""The lossy input-image plan's quality ladder (ADR 0015), promised as a pattern is (ADR 0011).

The device holds an image before the card's preprocessing; the plan uploads it as a lossy WebP at
some quality, and the server decodes it, preprocesses it and runs the whole model. The model is
run as every other count of the job runs it (:func:`offline.runner.float_graph`: batch norm
folded, channels-last), not as written: the same up to float rounding, and a third less time. A quality's
drop is the float model's net top-1 drop on the decoded images against the same images unencoded
(:class:`~offline.validation.PairedDrop`).

The ladder is fixed before any sample is read: qualities from the highest (most conservative) down.
For each level it is tested once on the calibration source's check samples, in that order, until
the first quality whose upper bound exceeds the level (:func:`offline.ltt.fixed_sequence`); every
quality before it is promised at that level, with probability at least 1 − δ as for any pattern,
with no correction for the ladder's length. A quality promised at some level is then measured once
on the test split (its ``test_drop``), which no step chose anything by.

``qpart calibrate`` measures the ladder for new artifacts whose card declares preprocessing and
whose data holds images (Fashion-MNIST, an ImageFolder; not arrays of tensors);
``qpart calibrate-images`` adds it to an existing artifact.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from qpart.models.image_codecs import WEBP, decode_webp, encode_webp, webp_encoder
from qpart.models.metrics import DEFAULT_METRIC, Metric, get_metric
from qpart.models.preprocess import PreprocessSpec, preprocess_image
from qpart.models.registry import ModelSpec, get_model
from qpart.models.sources import DataSource, FashionMnistSource, ImageFolderSource
from qpart.models.sources.decoding import IMAGE_FORMATS
from qpart.models.sources.files import read_regular
from qpart.offline.data import Sources, recorded_source
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.ltt import BOUNDS, ONE_SAMPLE, REFERENCE, Bound, Test, chance, fixed_sequence
from qpart.offline.report import markdown
from qpart.offline.runner import float_graph
from qpart.offline.samples import sample_positions
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop, paired_drop
from qpart.profiles.artifacts import ImageLadder, ImageRung, load_artifact, save_artifact, write_atomic

QUALITIES = CalibrationSettings.model_fields["image_qualities"].default
"""The default ladder, most conservative first (WebP at 50 still kept 1% on Fashion-MNIST's test
split for one of the three reference models: bench/results/input_codecs.json)."""
BATCH = 250
Tick = Callable[[int], None]


@dataclass(frozen=True)
class LadderSamples:
    """Images as the device holds them, with their labels (one role: check or test)."""

    images: Sequence[Image.Image] | Callable[[], Iterator[list[Image.Image]]]
    labels: np.ndarray


def source_images(source: DataSource, positions: np.ndarray) -> Iterator[list[Image.Image]]:
    """The images before preprocessing of ``source`` at ``positions``, :data:`BATCH` at a time.

    Raises:
        CalibrationConfigError: the source holds tensors, not images.
    """
    if isinstance(source, FashionMnistSource):
        pixels = source.pixels
        for start in range(0, len(positions), BATCH):
            yield [Image.fromarray(pixels[i], "L") for i in positions[start : start + BATCH].tolist()]
    elif isinstance(source, ImageFolderSource):
        for start in range(0, len(positions), BATCH):
            batch = []
            for i in positions[start : start + BATCH].tolist():
                # Read whole by read_regular (a regular file of bounded size, inside the root once
                # opened), not opened by Pillow: a FIFO, device or outside link swapped in is refused.
                data = read_regular(source.root / source.files[i], root=source.root)
                with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                    img.load()
                    batch.append(img.copy())
            yield batch
    else:
        raise CalibrationConfigError(f"the {source.kind} source holds tensors, not images: the input-image "
                                     "ladder needs the images themselves (Fashion-MNIST or an ImageFolder)")


def _logits(model: torch.nn.Module, images: list[Image.Image], spec: PreprocessSpec) -> torch.Tensor:
    x = np.stack([preprocess_image(im, spec) for im in images])
    with torch.inference_mode():
        logits: torch.Tensor = model(torch.from_numpy(x))
    return logits


def drops(model: torch.nn.Module, spec: PreprocessSpec, batches: Iterator[list[Image.Image]],
          labels: np.ndarray, qualities: Sequence[int], tick: Tick | None = None,
          metric: Metric | None = None) -> tuple[list[PairedDrop], list[float]]:
    """Per quality, the paired counts under ``metric`` (top-1 drop when None) against the
    unencoded images, and the mean encoded bytes."""
    judge = metric if metric is not None else get_metric(DEFAULT_METRIC)
    reference: list[np.ndarray] = []
    coded: dict[int, list[np.ndarray]] = {q: [] for q in qualities}
    sizes: dict[int, int] = dict.fromkeys(qualities, 0)
    done = 0
    for batch in batches:
        plain = _logits(model, batch, spec)
        anchor = judge.anchor(plain, labels[done : done + len(batch)])
        reference.append(judge.hits(plain, anchor))
        for q in qualities:
            bodies = [encode_webp(im, q) for im in batch]
            sizes[q] += sum(len(b) for b in bodies)
            coded[q].append(judge.hits(_logits(model, [decode_webp(b) for b in bodies], spec), anchor))
        done += len(batch)
        if tick is not None:
            tick(len(batch))
    if done != len(labels):
        raise CalibrationConfigError(f"{done} images for {len(labels)} labels")
    ref = np.concatenate(reference)
    return ([paired_drop(ref, np.concatenate(coded[q]), judge.paired) for q in qualities],
            [sizes[q] / max(done, 1) for q in qualities])


def promised_levels(measured: Sequence[PairedDrop], levels: Sequence[float], confidence: float,
                    bound: Bound) -> list[list[float]]:
    """Per rung (in ladder order), the levels at which the fixed-sequence test promises it."""
    out: list[list[float]] = [[] for _ in measured]
    for level in sorted(levels):
        test = Test(level, confidence, bound)

        def passes(i: int, t: Test = test) -> bool:
            return t.passes(measured[i])

        for i in range(fixed_sequence(len(measured), passes)):
            out[i].append(level)
    return out


def statement(delta: float, bound: Bound, check_samples: int, qualities: Sequence[int],
              metric: Metric | None = None) -> str:
    """The ladder's promise in one sentence (in ``metric``'s words; top-1 drop when None)."""
    shown = ", ".join(str(q) for q in qualities)
    judged = metric if metric is not None else get_metric(DEFAULT_METRIC)
    how = BOUNDS[bound] if judged.paired else ONE_SAMPLE
    sure = chance(bound if judged.paired else "exact")
    return (f"For each quality promised at a level, with probability {sure} over the draw of the "
            f"check samples, the {judged.summary} of the model on images this encoder made at that "
            f"quality, decoded and preprocessed as the card declares, against the same images "
            f"unencoded, on data from the calibration distribution, is at most the level: δ = {delta:g}; "
            f"bound: {how}; {check_samples:,} check samples; ladder: WebP qualities {shown}, "
            f"fixed before any sample was read, tested per level from the highest quality down until "
            f"the first failure; fixed-sequence testing ({REFERENCE}).")


def measure_ladder(model: torch.nn.Module, spec: PreprocessSpec, check: LadderSamples, test: LadderSamples,
                   levels: Sequence[float], confidence: float, bound: Bound,
                   qualities: Sequence[int] = QUALITIES, tick: Tick | None = None,
                   metric: Metric | None = None) -> ImageLadder:
    """The ladder tested on ``check``, its promised rungs measured on ``test`` (module doc)."""
    if list(qualities) != sorted(set(qualities), reverse=True):
        raise CalibrationConfigError(f"the ladder's qualities {list(qualities)} must be distinct and "
                                     "from the highest down (the most conservative is tested first)")
    model = model.eval()
    on_check, mean_bytes = drops(model, spec, _batches(check), check.labels, qualities, tick, metric)
    promised = promised_levels(on_check, levels, confidence, bound)
    kept = [q for q, lv in zip(qualities, promised, strict=True) if lv]
    on_test = dict(zip(kept, drops(model, spec, _batches(test), test.labels, kept, tick, metric)[0],
                       strict=True))
    rungs = [ImageRung(codec=WEBP, quality=q, levels=lv, calib_drop=d.drop,
                       calib_drop_ub=d.upper_bound(confidence, bound), mean_bytes=size,
                       test_drop=on_test[q].drop if q in on_test else None)
             for q, lv, d, size in zip(qualities, promised, on_check, mean_bytes, strict=True)]
    return ImageLadder(statement=statement(1 - confidence, bound, len(check.labels), qualities, metric),
                       encoder=webp_encoder(), check_samples=len(check.labels),
                       test_samples=len(test.labels), rungs=rungs)


def _batches(samples: LadderSamples) -> Iterator[list[Image.Image]]:
    if callable(samples.images):
        return samples.images()
    items = list(samples.images)
    return iter([items[i : i + BATCH] for i in range(0, len(items), BATCH)])


def role_samples(source: DataSource, positions: np.ndarray) -> LadderSamples:
    """The images and labels of ``source`` at ``positions`` (read lazily, a batch at a time)."""
    return LadderSamples(lambda: source_images(source, positions), source.labels()[positions])


def work(check_samples: int, test_samples: int) -> int:
    """What :func:`measure_ladder` tells its tick in all (images read, check then test)."""
    return check_samples + test_samples


def measure_artifact_images(directory: Path, qualities: Sequence[int] | None = None, tick: Tick | None = None,
                            data: str | None = None, test_data: str | None = None,
                            replace_ladder: bool = False) -> ImageLadder:
    """Measure the ladder for the artifact in ``directory`` (its weights, its check samples, its
    test samples, its levels and promise settings) and rewrite its ``artifact.json``. ``qualities``
    default to the artifact's own ``image_qualities`` setting where it records one, else
    :data:`QUALITIES`.

    A ladder is tested on the check samples once: an artifact that has one is refused unless
    ``replace_ladder`` (testing ladder after ladder on the same samples and keeping the one that
    looks best would void the promise).

    Raises:
        CalibrationConfigError: the card declares no preprocessing, the artifact's data cannot be
            found as recorded, its weights are not the artifact's, or it has a ladder already.
    """
    artifact = load_artifact(directory)
    if artifact.image_ladder is not None and not replace_ladder:
        raise CalibrationConfigError(
            f"{directory} has an input-image ladder already, tested on its check samples; a second "
            "ladder tested on the same samples voids the promise of whichever is kept. Recalibrate "
            "on new check samples, or replace it knowingly (--replace)")
    recorded = artifact.settings.get("image_qualities")
    if qualities is None:
        qualities = [int(q) for q in recorded] if isinstance(recorded, list) and recorded else QUALITIES
    spec = replace(get_model(artifact.model), weights=directory / "weights.safetensors")
    if spec.preprocess is None:
        raise CalibrationConfigError(f"'{artifact.model}' declares no preprocessing: no image becomes its "
                                     "input, so it has no input-image plan")
    if hashlib.sha256(spec.weights.read_bytes()).hexdigest() != artifact.weights_sha256:
        raise CalibrationConfigError(f"{directory}: weights.safetensors is not the artifact's (sha256)")
    record, promise = artifact.data, artifact.promise
    if record is None or promise is None:
        raise CalibrationConfigError(f"{directory}: the artifact records no data or promise; calibrate again")
    recorded_spec = record.calibration.preprocess
    if recorded_spec is not None and PreprocessSpec.from_mapping(recorded_spec) != spec.preprocess:
        raise CalibrationConfigError(
            f"'{artifact.model}' now declares another preprocessing than the one it was calibrated with; "
            "a ladder measured under it would not be the artifact's: calibrate it again")
    calibration = recorded_source(artifact, spec, "calibration", data)
    test = recorded_source(artifact, spec, "test", test_data)
    order = record.sample_order
    fit_check = sample_positions(calibration, record.fit_samples + record.check_samples, order)
    check_pos = np.sort(fit_check[record.fit_samples:])
    test_pos = np.sort(sample_positions(test, record.test_samples, order))
    levels = artifact.settings.get("levels")
    if not isinstance(levels, list) or not levels:
        raise CalibrationConfigError(f"{directory}: the artifact does not record its levels")
    ladder = measure_ladder(float_graph(spec.load(), spec.input_shape), spec.preprocess,
                            role_samples(calibration, check_pos),
                            role_samples(test, test_pos), [float(v) for v in levels], 1 - promise.delta,
                            "exact" if promise.bound == "exact" else "newcombe", qualities, tick,
                            get_metric(promise.metric))
    updated = artifact.model_copy(update={"image_ladder": ladder})
    save_artifact(updated, directory)
    write_atomic(directory / "report.md", markdown(updated))  # the report shows the ladder too
    return ladder



def job_ladder(spec: ModelSpec, sources: Sources, settings: CalibrationSettings,
               start: Callable[[str, int], Tick], load: Callable[[str], Any],
               save: Callable[[str, Any], None]) -> ImageLadder | None:
    """The calibration job's ladder stage (None where there is no ladder: no qualities, no
    preprocessing, or tensors for data), checkpointed by ``load`` / ``save``."""
    images = (FashionMnistSource, ImageFolderSource)
    if not settings.image_qualities or spec.preprocess is None or not all(
            isinstance(s, images) for s in (sources.calibration, sources.test)):
        return None
    saved = load("images")
    if saved is not None:
        return ImageLadder.model_validate(saved)
    fit_check = sample_positions(sources.calibration, settings.fit_count + settings.check_count,
                                 sources.order)
    test_count = len(sources.test) if settings.test_samples is None else min(settings.test_samples,
                                                                              len(sources.test))
    check_pos = np.sort(fit_check[settings.fit_count:])
    test_pos = np.sort(sample_positions(sources.test, test_count, sources.order))
    tick = start("input-image ladder", work(len(check_pos), len(test_pos)))
    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        tick(done[0])

    ladder = measure_ladder(float_graph(spec.load(), spec.input_shape), spec.preprocess,
                            role_samples(sources.calibration, check_pos),
                            role_samples(sources.test, test_pos), settings.levels, settings.confidence,
                            settings.bound, settings.image_qualities, advance, get_metric(settings.metric))
    save("images", ladder.model_dump(mode="json"))
    return ladder
