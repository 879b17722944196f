"""tritonclient[http], unmodified, against a live server on loopback."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from qpart.client.plans import HeadSpec, PacketFormat
from qpart.client.runtime import encode_for_plan, load_head
from qpart.models.data import Split, load_split
from tests.conftest import first_middle_cut

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
    middle = first_middle_cut(info)
    pattern = next(p for p in info["patterns"] if p["cut"] == middle and p["level"] == 0.01)
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


def _card() -> dict[str, object]:
    from qpart.models.registry import get_model

    spec = get_model("fmnist-cnn")
    assert spec.preprocess is not None and spec.labels is not None
    return {"preprocess": spec.preprocess.model_dump(mode="json"), "labels": list(spec.labels)}


@pytest.mark.parametrize("name", ["fmnist-cnn", "fmnist-cnn-tail"])
def test_metadata_parameters_carry_the_cards_preprocessing_and_labels(client, server, name):
    parameters = client.get_model_metadata(name)["parameters"]
    assert json.loads(parameters.pop("metric")) == "top1-drop"  # what the levels bound (issue 49)
    qualities = json.loads(parameters.pop("image_qualities")) if name == "fmnist-cnn" else None
    runtimes = json.loads(parameters.pop("runtimes")) if name == "fmnist-cnn" else None
    calibrated = json.loads(parameters.pop("calibrated_cuts")) if name == "fmnist-cnn" else None
    if calibrated is not None:  # the cuts plans are made at (issue 51): those the artifact has patterns at
        patterns = httpx.get(f"{server.url}/v1/models/fmnist-cnn").json()["patterns"]
        assert calibrated == sorted({p["cut"] for p in patterns}) and calibrated[0] == 0
    assert {k: json.loads(v) for k, v in parameters.items()} == _card()
    if runtimes is not None:  # the runtime table: a device's, so not the tail's
        assert set(runtimes) == {"torch", "onnx"}
        for table in runtimes.values():
            assert set(table) == {"cuts", "refused"} and table["cuts"][0] == 0
            assert sorted(table["cuts"] + [int(c) for c in table["refused"]]) == list(range(9))
    if qualities is not None:  # the model, not its tail, takes input images (ADR 0015)
        assert qualities and all(set(q) == {"codec", "quality", "level", "encoder"} for q in qualities)
    assert json.loads(parameters["labels"])[9] == "Ankle boot"


@pytest.mark.parametrize("binary", [True, False])
def test_classification_extension_gives_top_scores_with_index_and_label(client, binary):
    assert "classification" in client.get_server_metadata()["extensions"]
    test = load_split(Split.TEST, limit=16)
    inp = triton.InferInput("input", list(test.images.shape), "FP32")
    inp.set_data_from_numpy(test.images, binary_data=binary)
    plain = client.infer("fmnist-cnn", [inp], outputs=[triton.InferRequestedOutput("logits")])
    logits = plain.as_numpy("logits")
    top = client.infer("fmnist-cnn", [inp], outputs=[
        triton.InferRequestedOutput("logits", binary_data=binary, class_count=3)]).as_numpy("logits")
    assert top.shape == (16, 3)
    labels = _card()["labels"]
    for row, entries in zip(logits, top, strict=True):
        parts = [(e.decode() if isinstance(e, bytes) else e).split(":", 2) for e in entries]
        assert [int(index) for _, index, _ in parts] == np.argsort(-row, kind="stable")[:3].tolist()
        assert [label for _, _, label in parts] == [labels[int(index)] for _, index, _ in parts]
        assert [score for score, _, _ in parts] == [f"{row[int(index)]:f}" for _, index, _ in parts]


def test_classification_asks_at_most_every_class(client):
    inp = triton.InferInput("input", [1, 1, 28, 28], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
    top = client.infer("fmnist-cnn", [inp], outputs=[triton.InferRequestedOutput("logits", class_count=50)])
    assert top.as_numpy("logits").shape == (1, 10)


def test_unknown_input_name_is_a_400_naming_the_expected_input(client, server):
    inp = triton.InferInput("images", [1, 1, 28, 28], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("fmnist-cnn", [inp])
    assert str(info.value.status()) == "400"
    assert "no input 'images'" in info.value.message() and "'input'" in info.value.message()
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8", "data": [0]}],
            "parameters": {"pattern_id": "p"}}
    answer = httpx.post(f"{server.url}/v2/models/fmnist-cnn-tail/infer", json=body)
    assert answer.status_code == 400 and "'activation_packet'" in answer.json()["error"]
