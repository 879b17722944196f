"""tritonclient[http], unmodified, against a live server on loopback."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from qpart.client.plans import HeadSpec, PacketFormat
from qpart.client.runtime import encode_for_plan, load_head
from qpart.models.data import Split, load_split

pytestmark = pytest.mark.integration


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


def test_tail_model_infer_with_uint8_packet_and_flat_parameters(client, server):
    info = httpx.get(f"{server.url}/v1/models/fmnist-cnn").json()
    pattern = next(p for p in info["patterns"] if p["cut"] == 3 and p["level"] == 0.01)
    segment = httpx.get(f"{server.url}{pattern['segment']['url']}").content
    head = load_head(HeadSpec.model_validate({**pattern, "model": "fmnist-cnn", "version": info["version"],
                                              "cuts": info["cuts"]}), segment)
    test = load_split(Split.TEST, limit=8)
    with torch.inference_mode():
        act = head(torch.from_numpy(test.images)).numpy()
    packet = np.frombuffer(encode_for_plan(act, PacketFormat.model_validate(pattern)), dtype=np.uint8)
    inp = triton.InferInput("activation_packet", [packet.size], "UINT8")
    inp.set_data_from_numpy(packet, binary_data=True)
    result = client.infer("fmnist-cnn-tail", [inp], parameters={"pattern_id": pattern["pattern_id"]})
    logits = result.as_numpy("logits")
    assert logits.shape == (8, 10) and np.mean(logits.argmax(1) == test.labels) >= 0.75
