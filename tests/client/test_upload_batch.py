"""Uploads within the server's body limit (issue 48): plans and pattern listings carry
``upload_batch``, the most samples whose packet fits ``max_body_bytes``, and the device splits its
inputs into requests of at most that many (a float32 activation of 64 samples was a 413)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qpart.client.device import encode_for_plan
from qpart.client.plans import PacketFormat
from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels.wire import encode_float_activation, packet_bytes
from qpart.profiles.devices import DeviceProfile
from qpart.server.tails.packets import coded_bytes_bound
from tests.server.conftest import make_client

LIMIT = 16 << 10
IMAGES = 150


def _cut0_profile(version: str, cuts: int) -> DeviceProfile:
    """A device whose heads past cut 0 take 10 s: every plan sends the input itself."""
    return DeviceProfile.model_validate({
        "schema_version": 2, "name": "cut0", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.0,
        "measured": {"fmnist-cnn": {"version": version, "head_s": [0.0] + [10.0] * (cuts - 1),
                                    "warmup": 0, "repeats": 1}}})


def _run(app, tmp_path, x):
    """``x`` through the torch device at demand 0 (float32 input packets), every upload's size."""
    info = app.get("/v1/models/fmnist-cnn").json()
    settings = DeviceSettings(server=str(app.base_url), cache_dir=tmp_path)
    sent: list[int] = []
    # not closed here: its transport is the test's client, which the test closes
    device = DeviceRuntime(settings, device_profile=_cut0_profile(info["version"], info["cuts"]),
                           transport=Transport(settings, client=app))
    send = device._send  # every tail upload goes through it (_post too)

    def counting(plan, body, headers):
        sent.append(len(body))
        return send(plan, body, headers)

    device._send = counting  # type: ignore[method-assign]
    return device.infer(x, "fmnist-cnn", 0.0, rate_bps=1e9), sent


@pytest.fixture(scope="module")
def inputs() -> np.ndarray:
    return np.random.default_rng(48).random((IMAGES, 1, 28, 28), dtype=np.float32)


def test_a_small_body_limit_splits_150_inputs_into_requests_that_fit(cnn_only, tmp_path, inputs):
    with make_client(cnn_only) as roomy:
        want, _ = _run(roomy, tmp_path / "roomy", inputs)
    with make_client(cnn_only, max_body_bytes=LIMIT) as small:
        run, sent = _run(small, tmp_path / "small", inputs)
    plan = run.plan
    assert plan.cut == 0 and plan.activation_bits == 32 and plan.upload_batch is not None
    one = packet_bytes((1, 1, 28, 28), 32, plan.group_size)
    assert plan.upload_batch == (LIMIT - 256) // (one + 1)  # 3,160 bytes a sample, 1/256 coding margin
    assert coded_bytes_bound(packet_bytes((plan.upload_batch, 1, 28, 28), 32, 0)) <= LIMIT
    assert coded_bytes_bound(packet_bytes((plan.upload_batch + 1, 1, 28, 28), 32, 0)) > LIMIT
    assert len(sent) == math.ceil(IMAGES / plan.upload_batch) and max(sent) <= LIMIT
    assert len(run.predictions) == IMAGES and run.predictions == want.predictions
    assert want.plan.upload_batch == 256  # the queue's limit, under the default 8 MiB


def test_64_float_rows_in_one_request_are_refused_413(cnn_only, tmp_path, inputs):
    with make_client(cnn_only, max_body_bytes=LIMIT) as small:
        run, _ = _run(small, tmp_path, inputs[:1])
        body = encode_float_activation(inputs[:64])
        assert len(body) > LIMIT
        refused = small.post(run.plan.infer_url, content=body,
                             headers={"Content-Type": "application/octet-stream"})
        assert refused.status_code == 413, refused.text
        float32 = PacketFormat(activation_bits=32, group_size=1)
        fits = encode_for_plan(inputs[: run.plan.upload_batch], float32)
        assert small.post(run.plan.infer_url, content=fits).status_code == 200


def test_every_listed_pattern_says_how_many_samples_one_upload_carries(cnn_only):
    artifact = json.loads((cnn_only / "fmnist-cnn" / "artifact.json").read_text())
    shapes = {c["index"]: tuple(c["activation_shape"]) for c in artifact["cuts"]}
    with make_client(cnn_only, max_body_bytes=LIMIT) as small:
        for runtime in ("torch", "onnx"):
            info = small.get("/v1/models/fmnist-cnn", params={"runtime": runtime}).json()
            assert info["patterns"]
            for p in info["patterns"]:
                n, bits, group = p["upload_batch"], p["activation_bits"], p["group_size"]
                fits = coded_bytes_bound(packet_bytes((n, *shapes[p["cut"]]), bits, group)) <= LIMIT
                more = coded_bytes_bound(packet_bytes((n + 1, *shapes[p["cut"]]), bits, group)) > LIMIT
                assert n >= 1 and (fits or n == 1) and (more or n == 256), p
