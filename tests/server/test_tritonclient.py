"""tritonclient[http], unmodified, against a live server on loopback."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from models.data import Split, load_split

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(cnn_only):
    from tests.conftest import LiveServer

    live = LiveServer(cnn_only)
    live.wait_ready()
    yield live
    live.stop()


@pytest.fixture
def client(server):
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def test_server_and_model_health(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("fmnist-cnn")
    assert not client.is_model_ready("no-such-model")


def test_metadata(client):
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("fmnist-cnn")
    assert model["inputs"][0]["shape"] == [-1, 1, 28, 28] and model["outputs"][0]["name"] == "logits"


@pytest.mark.parametrize("binary", [True, False])
def test_infer_classifies_test_images(client, binary):
    test = load_split(Split.TEST, limit=64)
    inp = triton.InferInput("input", list(test.images.shape), "FP32")
    inp.set_data_from_numpy(test.images, binary_data=binary)
    out = triton.InferRequestedOutput("logits", binary_data=binary)
    result = client.infer("fmnist-cnn", [inp], outputs=[out])
    logits = result.as_numpy("logits")
    assert logits.shape == (64, 10)
    assert np.mean(logits.argmax(1) == test.labels) > 0.85


def test_unknown_model_surfaces_as_a_404_error(client):
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no-such-model")
    assert info.value.status() == "404" or str(info.value.status()) == "404"
    assert "unknown model" in info.value.message()


def test_bad_shape_is_a_400_error(client):
    inp = triton.InferInput("input", [1, 3, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 3), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("fmnist-cnn", [inp])
    assert "expected [batch, 1, 28, 28]" in info.value.message()
