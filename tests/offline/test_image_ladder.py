"""The input-image ladder (ADR 0015): fixed-sequence testing per level, drops measured as the server
will serve the images, and the sources it can and cannot read images from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from qpart.models.data import Split, load_split_pixels
from qpart.models.image_codecs import decode_webp, encode_webp
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.image_ladder import LadderSamples, measure_ladder, promised_levels, source_images
from qpart.offline.validation import PairedDrop


def test_each_level_promises_the_rungs_before_its_first_failure():
    n = 6000
    # bounds (exact, 95%): about 0.1%, 0.6%, 1.5%, 0.6%: the last passes 1% but comes after a failure
    drops = [PairedDrop(n, 3, 0), PairedDrop(n, 25, 2), PairedDrop(n, 80, 5), PairedDrop(n, 25, 2)]
    levels = promised_levels(drops, [0.005, 0.01, 0.02], 0.95, "exact")
    assert levels[0] == [0.005, 0.01, 0.02]
    assert levels[1] == [0.01, 0.02]
    assert levels[2] == [0.02]
    assert levels[3] == [0.02]  # 1% is not promised: the sequence at 1% stopped at the third rung
    assert promised_levels([PairedDrop(n, 200, 0)], [0.01], 0.95, "exact") == [[]]


@pytest.fixture(scope="module")
def cnn():
    spec = get_model("fmnist-cnn")
    return spec, spec.load().eval()


def _samples(start: int, count: int) -> LadderSamples:
    pixels, labels, _ = load_split_pixels(Split.TEST, start + count)
    return LadderSamples([Image.fromarray(p, "L") for p in pixels[start:]], labels[start:])


def test_a_quality_drop_is_the_float_models_on_the_decoded_images(cnn):
    spec, model = cnn
    check, test = _samples(0, 300), _samples(300, 200)
    ladder = measure_ladder(model, spec.preprocess, check, test, [0.01, 0.02], 0.95, "exact", (90, 30))
    assert [r.quality for r in ladder.rungs] == [90, 30]

    def correct(images: list[Image.Image]) -> np.ndarray:
        x = torch.from_numpy(np.stack([preprocess_image(im, spec.preprocess) for im in images]))
        with torch.inference_mode():
            return model(x).argmax(1).numpy() == check.labels

    images = list(check.images)  # type: ignore[arg-type]
    plain = correct(images)
    coded = correct([decode_webp(encode_webp(im, 30)) for im in images])
    want = (np.sum(plain & ~coded) - np.sum(~plain & coded)) / len(images)
    assert ladder.rungs[1].calib_drop == pytest.approx(want)
    assert ladder.rungs[1].mean_bytes == pytest.approx(np.mean([len(encode_webp(im, 30)) for im in images]))
    for rung in ladder.rungs:
        assert (rung.test_drop is None) == (not rung.levels)
        assert all(rung.calib_drop_ub <= level for level in rung.levels)


def test_the_statement_says_how_sure_each_bound_is():
    from qpart.offline.image_ladder import statement

    assert "at least 1−δ" in statement(0.05, "exact", 6000, (90, 75))
    newcombe = statement(0.05, "newcombe", 6000, (90, 75))
    assert "about 1−δ" in newcombe and "nominal" in newcombe and "at least" not in newcombe


def test_the_ladder_must_run_from_the_highest_quality_down(cnn):
    spec, model = cnn
    with pytest.raises(CalibrationConfigError, match="from the highest down"):
        measure_ladder(model, spec.preprocess, _samples(0, 10), _samples(10, 10), [0.01], 0.95, "exact",
                       (50, 90))


def test_a_source_of_tensors_has_no_images(tmp_path):
    from safetensors.numpy import save_file

    from qpart.models.sources import ArraySource

    path = tmp_path / "x.safetensors"
    save_file({"x": np.zeros((4, 1, 28, 28), np.float32), "y": np.arange(4, dtype=np.int64)}, path)
    with pytest.raises(CalibrationConfigError, match="holds tensors, not images"):
        next(source_images(ArraySource(path), np.arange(2)))


def test_an_image_folder_is_read_through_the_same_guard_as_calibration(tmp_path):
    """Issue 52, review finding 8: read whole (regular file, bounded, inside the root once opened)."""
    from qpart.models.errors import ImageDecodeError
    from qpart.models.sources import ImageFolderSource
    from tests.models.sources.conftest import SPEC, write_image

    root = tmp_path / "images"
    write_image(root / "cat" / "a.png", 1)
    write_image(root / "dog" / "b.png", 2)
    source = ImageFolderSource(root, SPEC)
    (images,) = list(source_images(source, np.arange(2)))
    assert [im.size for im in images] == [(10, 12), (10, 12)]
    outside = write_image(tmp_path / "elsewhere" / "secret.png", 3)
    (root / "cat" / "a.png").unlink()
    (root / "cat" / "a.png").symlink_to(outside)  # after the scan
    with pytest.raises(ImageDecodeError, match="outside the ImageFolder"):
        next(source_images(source, np.arange(2)))
