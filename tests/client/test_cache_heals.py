"""A segment that fails to load or run on the device is deleted from its cache (issue 48): the next
plan request does not announce it as held, and the next run downloads what the server sends, with
no manual prune."""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
import pytest

from qpart.client.errors import CACHE_HEALED, SegmentError, SegmentRefusedError
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels.onnx_segment import OnnxSegmentLimits
from qpart.kernels.segment_format import SegmentHeader, encode_segment
from qpart.models.errors import UnknownModelError
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.profiles.artifacts import Pattern
from qpart.server.store.segments import build_onnx_segment
from tests.client.samples import PLAN

MODEL, VERSION = "fmnist-cnn", "v1"


def _segments() -> tuple[dict, bytes, bytes]:
    """The all-device plan's head fields, a broken segment (a tensor of the wrong shape that
    passes every byte check) and a good one."""
    spec = get_model(MODEL)
    gm = prepare(spec.load(), spec.input_shape)
    cuts = cuts_of(gm)
    cut = cuts[-1]
    head, _ = split(gm, cut)
    floats = {name: t.detach().numpy().astype(np.float32)
              for name, t in [*head.named_parameters(), *head.named_buffers()]}
    header = SegmentHeader(MODEL, VERSION, cut.index, "c-all")
    good = encode_segment(header, {}, floats)
    name = next(iter(floats))
    broken = encode_segment(header, {}, {**floats, name: floats[name].reshape(-1)})
    fields = {"cut": cut.index, "cut_node": cut.node, "cuts": len(cuts), "infer_url": None,
              "plan_id": f"{MODEL}@{VERSION}/c-all", "activation_shape": list(cut.shape)}
    return fields, broken, good


def test_a_head_that_fails_is_evicted_and_the_next_run_downloads_a_good_one(tmp_path):
    fields, broken, good = _segments()
    served = [broken, good]
    held: list[list[str]] = []
    by_id = {hashlib.sha256(b).hexdigest(): b for b in served}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/plan":
            held.append(json.loads(request.content)["held_segments"])
            data = served[min(len(held) - 1, 1)]
            digest = hashlib.sha256(data).hexdigest()
            segment = {"id": digest, "url": f"/v1/segments/{digest}", "size_bytes": len(data),
                       "sha256": digest, "held": digest in held[-1], "runtime": "torch"}
            return httpx.Response(200, json={**PLAN, **fields, "segment": segment})
        data = by_id[request.url.path.rsplit("/", 1)[-1]]
        return httpx.Response(200, content=data, headers={"Content-Length": str(len(data))})

    settings = DeviceSettings(server="http://qpart.test", cache_dir=tmp_path, retries=1, backoff_s=0.01)
    client = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    runtime = DeviceRuntime(settings, transport=Transport(settings, client=client))
    images = np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32)
    broken_id = hashlib.sha256(broken).hexdigest()
    with pytest.raises(SegmentError, match=CACHE_HEALED) as info:
        runtime.infer(images, MODEL, 0.01)
    assert "\n" not in str(info.value)
    assert [e.segment_id for e in runtime.cache.entries()] == []
    run = runtime.infer(images, MODEL, 0.01)
    assert held[1] == [] and broken_id not in held[1]
    assert len(run.predictions) == 4
    assert [e.segment_id for e in runtime.cache.entries()] == [hashlib.sha256(good).hexdigest()]


def _onnx_segment() -> tuple[dict, bytes]:
    """The all-device plan's head fields and its ONNX segment (float32 weights)."""
    spec = get_model(MODEL)
    gm = prepare(spec.load(), spec.input_shape)
    cuts = cuts_of(gm)
    cut = cuts[-1]
    head, _ = split(gm, cut)
    pattern = Pattern.model_construct(pattern_id="c-all", cut=cut.index, weight_bits={})
    data = build_onnx_segment(head, spec.input_shape, MODEL, VERSION, pattern)
    fields = {"cut": cut.index, "cut_node": cut.node, "cuts": len(cuts), "infer_url": None,
              "plan_id": f"{MODEL}@{VERSION}/c-all", "activation_shape": list(cut.shape)}
    return fields, data


def _serving(tmp_path, fields: dict, data: bytes, runtime: str,
             **plan: object) -> tuple[DeviceSettings, httpx.Client]:
    """Settings and a client for a server that plans ``data`` (with ``plan``'s fields) every time."""
    digest = hashlib.sha256(data).hexdigest()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/plan":
            held = digest in json.loads(request.content)["held_segments"]
            segment = {"id": digest, "url": f"/v1/segments/{digest}", "size_bytes": len(data),
                       "sha256": digest, "held": held, "runtime": runtime}
            return httpx.Response(200, json={**PLAN, **fields, **plan, "segment": segment})
        return httpx.Response(200, content=data, headers={"Content-Length": str(len(data))})

    settings = DeviceSettings(server="http://qpart.test", cache_dir=tmp_path, retries=1, backoff_s=0.01)
    return settings, httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))


def _images() -> np.ndarray:
    return np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32)


def test_an_onnx_head_whose_output_is_not_the_plans_shape_is_evicted_with_a_segment_error(tmp_path):
    fields, data = _onnx_segment()
    settings, client = _serving(tmp_path, fields, data, "onnx", activation_shape=[11])
    runtime = OnnxDeviceRuntime(settings, transport=Transport(settings, client=client), threads=1)
    shape = r"made an activation of shape \[4, 10\], not the plan's \[4, 11\]; "
    with pytest.raises(SegmentError, match=shape + CACHE_HEALED):
        runtime.infer(_images(), MODEL, 0.01)
    assert runtime.cache.entries() == []


def test_a_segment_the_devices_check_refuses_at_load_keeps_its_class_and_is_evicted(tmp_path):
    class SharedCache(OnnxDeviceRuntime):
        """A device whose cache another, laxer process filled: the download is not checked."""

        def segment_check(self, plan):
            return None

    fields, data = _onnx_segment()
    settings, client = _serving(tmp_path, fields, data, "onnx")
    runtime = SharedCache(settings, transport=Transport(settings, client=client), threads=1,
                          limits=OnnxSegmentLimits(max_nodes=2))
    with pytest.raises(SegmentRefusedError, match=CACHE_HEALED):
        runtime.infer(_images(), MODEL, 0.01)
    assert runtime.cache.entries() == []


def test_a_failure_that_is_not_the_segments_leaves_it_cached(tmp_path):
    """A model this device has no code for: the segment is fine and stays held."""
    fields, _, good = _segments()
    settings, client = _serving(tmp_path, fields, good, "torch", model="not-on-this-device")
    runtime = DeviceRuntime(settings, transport=Transport(settings, client=client))
    with pytest.raises(UnknownModelError):
        runtime.infer(_images(), MODEL, 0.01)
    assert [e.segment_id for e in runtime.cache.entries()] == [hashlib.sha256(good).hexdigest()]
