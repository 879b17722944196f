"""Training through the ImageFolder path: fmnist-mobilenet's recipe reads the PNG export of the
train split with its card's camera-style preprocessing, and writes weights the registry loads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from qpart.models.data import Split
from qpart.models.errors import DatasetError
from qpart.models.registry import get_model
from qpart.models.sources import ImageFolderSource
from qpart.models.training import RECIPES, exported_split, train_model


def test_fmnist_mobilenet_trains_on_the_image_folder_export():
    assert RECIPES["fmnist-mobilenet"].data == "image-folder"
    assert RECIPES["fmnist-cnn"].data == "idx"


@pytest.mark.slow
def test_a_short_run_exports_the_splits_and_writes_loadable_weights_and_a_card(tmp_path):
    steps: list[int] = []
    card = train_model("fmnist-mobilenet", tmp_path / "out", threads=1, image_folder=tmp_path / "png",
                       limit=160, epochs=1, progress=lambda step, total, loss: steps.append(total))
    assert steps == [2, 2]  # 160 images at batch 128
    source = ImageFolderSource(tmp_path / "png" / "train", get_model("fmnist-mobilenet").preprocess)
    assert len(source) == 160 and source.sample_shape == (3, 64, 64)
    assert len(ImageFolderSource(tmp_path / "png" / "test", source.describe().preprocess)) == 160
    written = json.loads((tmp_path / "out" / "fmnist-mobilenet.card.json").read_text())
    assert written == card and card["limit"] == 160 and card["recipe"]["epochs"] == 1
    assert card["preprocess"] == get_model("fmnist-mobilenet").card["preprocess"]
    assert card["labels"][0] == "T-shirt/top" and 0 <= card["test_accuracy"] <= 1
    model = get_model("fmnist-mobilenet").build()
    model.load_state_dict(load_file(str(tmp_path / "out" / "fmnist-mobilenet.safetensors")))
    assert model.eval()(torch.zeros(1, 3, 64, 64)).shape == (1, 10)


def test_an_export_of_another_size_is_refused(tmp_path):
    exported_split(Split.TEST, tmp_path / "test", limit=150)
    assert exported_split(Split.TEST, tmp_path / "test", limit=150) == tmp_path / "test"  # reused
    with pytest.raises(DatasetError, match="holds 150 images but the test split exports 10000"):
        exported_split(Split.TEST, tmp_path / "test")
