"""bench.e2e.probes: the device's link probe sends what its plans send, and its fit prices it so."""

from __future__ import annotations

import pytest

from bench.e2e import ModelView
from bench.e2e.device import Link
from bench.e2e.grid import model_images
from bench.e2e.probes import fit_link, probe_uploads
from bench.exchange import probe_medians
from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.kernels.coding import decode
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.devices import get_device
from qpart.server.planner import PlanInputs, price_upload
from qpart.server.schemas import PRESETS, WeightPreset


def _view(artifacts_dir, name: str) -> ModelView:
    artifact = load_artifact(artifacts_dir / name)
    cuts = len(artifact.cuts)
    patterns = [{"pattern_id": p.pattern_id, "cut": p.cut, "level": p.level,
                 "activation_bits": p.activation_bits, "group_size": p.group_size,
                 "infer_url": f"/infer/{p.pattern_id}"} for p in artifact.patterns]
    return ModelView(name, artifact.version, cuts, [1e-3] * cuts, patterns, artifact, [], [], 200)


@pytest.mark.parametrize("name", ["fmnist-cnn", "fmnist-mobilenet"])
def test_the_probe_uploads_the_fewest_bits_and_float32_coded_as_plans_send_them(artifacts_dir, name):
    model = _view(artifacts_dir, name)
    image = model_images(name, 1)
    small, large = probe_uploads(model, image)
    fewest = min(p["activation_bits"] for p in model.patterns if p["cut"] == 0)
    assert small.pattern["activation_bits"] == fewest
    assert large.pattern["activation_bits"] == 32
    for upload in (small, large):
        raw = encode_for_plan(image, PacketFormat.model_validate(upload.pattern))
        assert upload.coding is not None  # every cut-0 packet of these models shrinks
        ratios = model.artifact.cuts[0].coding_ratio
        bits = upload.pattern["activation_bits"]
        assert ratios[upload.coding][bits] == min(r[bits] for r in ratios.values())
        assert upload.headers["Content-Encoding"] == upload.coding.value
        assert decode(upload.body, upload.coding, max_bytes=len(raw)) == raw
    # fmnist-mobilenet's float32 packet: 49 KB as is, a few KB as its all-server plan sends it
    raw_large = encode_for_plan(image, PacketFormat.model_validate(large.pattern))
    assert len(large.body) < len(raw_large) / 2
    assert len(large.body) > 2 * len(small.body)  # still a slope to fit


def test_the_fit_prices_the_small_exchange_at_its_coded_body(artifacts_dir):
    model = _view(artifacts_dir, "fmnist-mobilenet")
    image = model_images("fmnist-mobilenet", 1)
    small, large = probe_uploads(model, image)
    goodput, upload_rate, rtt = 5e6, 4e6, 1.5e-3
    pattern = model.pattern(small.pattern["pattern_id"])
    inputs = PlanInputs(get_device("raspberry-pi-4"), PRESETS[WeightPreset.LATENCY_FIRST], goodput, rtt,
                        1, 1.0, frozenset(), upload_rate_bps=upload_rate)
    # the link the cost model describes: the small exchange as a plan's coded upload of its body
    priced = price_upload(model.artifact, pattern, None, 0, inputs, answer_bytes=model.answer_bytes,
                          ratio=len(small.body) / pattern.activation_bytes, coding=small.coding)
    small_rest = priced.time_s.transfer
    extra = (len(large.body) - len(small.body)) * 8
    large_rest = small_rest + extra / upload_rate
    probe = probe_medians([small_rest] * 3, [large_rest] * 3, len(small.body) * 8 / goodput,
                          len(large.body) * 8 / goodput)
    link = Link(5.0, goodput, 0.0, None)  # type: ignore[arg-type]  # the fit never touches the wire
    fitted_rtt, fitted_rate = fit_link(model, link, [probe], image)
    assert fitted_rate == pytest.approx(upload_rate)
    assert fitted_rtt == pytest.approx(rtt)

