"""bench.e2e's naive baselines and forced cuts are priced by the planner's own cost model."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from bench.e2e import ModelView, _predict
from bench.e2e.artifacts import with_baselines
from bench.e2e.baselines import Baseline, predict
from bench.e2e.cell import forced_cuts
from bench.e2e.config import DEMAND
from bench.e2e.sitting import _key
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.costs import HTTP_EXCHANGE_BYTES, PlanInputs
from qpart.profiles.devices import MeasuredHeads, get_device
from qpart.server.schemas import PRESETS, WeightPreset
from tests.conftest import first_middle_cut


def _view(artifacts_dir) -> ModelView:
    # as the grid serves it: the baselines' patterns added, a float head at each cut the calibration pruned
    artifact = with_baselines(load_artifact(artifacts_dir / "fmnist-cnn"))
    cuts = len(artifact.cuts)
    patterns = [{"pattern_id": p.pattern_id, "cut": p.cut, "level": p.level, "test_drop": p.test_drop,
                 "segment": None if p.cut == 0 else {"id": f"seg-{p.pattern_id}", "size_bytes": 1000 * p.cut}}
                for p in artifact.patterns]
    return ModelView("fmnist-cnn", artifact.version, cuts, [1e-3] * cuts, patterns, artifact, [], [], 200)


def _inputs(model: ModelView, held: frozenset[str] = frozenset()) -> PlanInputs:
    measured = MeasuredHeads(version=model.version, head_s=[0.002 * k for k in range(model.cuts)],
                             encode_s=[1e-5] * model.cuts, warmup=1, repeats=1)
    device = get_device("raspberry-pi-4").model_copy(update={"measured": {model.name: measured}})
    return PlanInputs(device, PRESETS[WeightPreset.LATENCY_FIRST], 5e6, 1e-3, 1, 1.0, held,
                      upload_rate_bps=4e6)


PNG = Baseline("input-png", "codec", 0, 0.0, codec="png", host_local_s=1e-4, host_server_s=2e-4,
               upload_bytes=500.0)  # 0.1 ms to encode on the host, 0.2 ms to decode, 500 B


def test_a_codec_is_priced_as_its_bytes_its_encode_and_its_decode(artifacts_dir):
    model = _view(artifacts_dir)
    inputs = _inputs(model)
    codec = PNG
    one = predict(codec, model, inputs.device, inputs, ratio=3.0, segment=None)
    assert one["time_s"]["local"] == pytest.approx(3e-4)  # host encode x device ratio
    assert one["time_s"]["server"] == pytest.approx(1e-3 + 2e-4)  # tail + decoding
    more = predict(dataclasses.replace(codec, upload_bytes=1500.0), model, inputs.device, inputs, 3.0, None)
    assert more["time_s"]["transfer"] - one["time_s"]["transfer"] == pytest.approx(1000 * 8 / 4e6)
    assert one["transfer_bytes"] == more["transfer_bytes"] - 1000


def test_an_autoencoder_pays_its_head_its_encoder_download_and_its_exchange_only_when_cold(artifacts_dir):
    model = _view(artifacts_dir)
    ae = Baseline("autoencoder@3", "ae", 3, 0.008, encoder_bytes=bytes(4000), host_local_s=1e-4,
                  host_server_s=1e-4, upload_bytes=212.0)
    segment = {"id": "seg-x", "size_bytes": 10_000}
    cold = predict(ae, model, _inputs(model).device, _inputs(model), 2.0, segment)
    warm = predict(ae, model, _inputs(model).device, _inputs(model, frozenset({"seg-x"})), 2.0, segment)
    assert cold["time_s"]["local"] == pytest.approx(0.006 + 2e-4) == warm["time_s"]["local"]
    gap = cold["time_s"]["transfer"] - warm["time_s"]["transfer"]
    # the segment and the encoder (one exchange each) at 5 Mbit/s
    assert gap == pytest.approx((14_000 + 2 * HTTP_EXCHANGE_BYTES) * 8 / 5e6 + 2 * 1e-3)
    assert cold["objective"] > warm["objective"]


def test_every_cut_is_forced_with_the_planners_own_cheapest_pattern_for_the_demand(artifacts_dir):
    model = _view(artifacts_dir)
    inputs = _inputs(model)
    forced = forced_cuts(model, inputs)
    # every cut the calibration kept (the float heads the baselines add at the others: no demand admits them)
    calibrated = load_artifact(artifacts_dir / "fmnist-cnn").calibrated_cuts
    assert sorted(forced) == sorted(f"cut-{k}" for k in calibrated)
    for name, plan in forced.items():
        k = int(name.removeprefix("cut-"))
        options = [p for p in model.patterns if p["cut"] == k and p["level"] <= DEMAND]
        assert plan["cut"] == k and plan["level"] <= DEMAND
        assert _predict(model, plan, inputs)["objective"] == min(
            _predict(model, p, inputs)["objective"] for p in options)


def test_the_planners_image_plan_is_priced_as_the_png_baseline_and_shares_its_runs(artifacts_dir):
    model = _view(artifacts_dir)
    inputs = _inputs(model)
    codec = PNG
    baseline = predict(codec, model, inputs.device, inputs, ratio=3.0, segment=None)
    plan = {"pattern_id": "input-png", "cut": 0, "input_image": {"png_bytes": 500, "encode_s": 3e-4},
            "predicted": {"time_s": {"server": 1e-3 + 2e-4}}}
    planner = _predict(model, plan, inputs)
    for key in ("objective", "transfer_bytes"):
        assert planner[key] == pytest.approx(baseline[key], rel=1e-12)
    assert planner["time_s"] == pytest.approx(baseline["time_s"], rel=1e-12)
    assert _key(plan) == codec.name  # one request, measured once a round for both
    assert _key({"pattern_id": "c0-x", "upload_encoding": "zstd"}) == "c0-x/zstd"


def test_the_planners_webp_plan_is_priced_as_its_qualitys_baseline_and_shares_its_runs(artifacts_dir):
    from bench.e2e.baselines import CODECS, load_baselines, product_quality, promised

    model = _view(artifacts_dir)
    quality = product_quality(model.artifact, DEMAND)
    rung = next(r for r in model.artifact.image_ladder.rungs if r.quality == quality)
    assert rung.level is not None and rung.level <= DEMAND
    assert all(r.level is None or r.level > DEMAND or r.quality >= quality
               for r in model.artifact.image_ladder.rungs)  # the lowest quality promised at the demand
    named = {b.name: b for b in load_baselines("fmnist-cnn", artifact=model.artifact)}
    assert f"webp@{quality}" not in CODECS  # cnn's offer at 1% is no fixed baseline: it is added,
    webp = named[f"input-webp@{quality}"]  # with the artifact's test drop
    assert webp.test_drop == rung.test_drop
    assert promised(model.artifact, webp.codec) and not promised(model.artifact, "jpeg@90")
    codec = dataclasses.replace(webp, host_local_s=3e-4, host_server_s=2e-4, upload_bytes=240.0)
    inputs = _inputs(model)
    baseline = predict(codec, model, inputs.device, inputs, ratio=3.0, segment=None)
    plan = {"pattern_id": f"input-webp@{quality}", "cut": 0, "level": rung.level,
            "input_image": {"png_bytes": 500, "encode_s": 3e-4,
                            "webp": [{"quality": quality, "bytes": 240, "encode_s": 9e-4}]},
            "predicted": {"time_s": {"server": 1e-3 + 2e-4}}}
    planner = _predict(model, plan, inputs)
    for key in ("objective", "transfer_bytes"):
        assert planner[key] == pytest.approx(baseline[key], rel=1e-12)
    assert _key(plan) == codec.name


@pytest.mark.parametrize("which", ["every-cut", "committed"])
def test_an_onnx_device_runs_the_onnx_segment_as_the_torch_device_runs_the_safetensors_one(
        every_cut, cnn_only, which):
    import numpy as np
    import torch

    from bench.e2e.device import load_device_head
    from qpart.kernels.onnx_segment import HeadRuntime
    from tests.server.conftest import make_client

    x = torch.from_numpy(np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32))
    with make_client(every_cut if which == "every-cut" else cnn_only) as client:
        outs = {}
        for runtime in HeadRuntime:
            info = client.get("/v1/models/fmnist-cnn", params={"runtime": runtime.value}).json()
            view = ModelView("fmnist-cnn", info["version"], info["cuts"], [], info["patterns"], None, [], [],
                             0, runtime=runtime)
            # cut 3 of the every-cut artifact; the committed one's first calibrated middle cut
            cut = 3 if which == "every-cut" else first_middle_cut(info)
            p = next(p for p in info["patterns"] if p["level"] == 0 and p["cut"] == cut)
            head = load_device_head(view, view.plan_of(p), client.get(p["segment"]["url"]).content)
            with torch.inference_mode():
                outs[runtime] = head(x).numpy()
            if runtime is HeadRuntime.ONNX:  # cut 0 has no segment: the input goes up as it is
                assert load_device_head(view, view.plan_of({**p, "cut": 0}), None)(x) is x
    np.testing.assert_allclose(outs[HeadRuntime.ONNX], outs[HeadRuntime.TORCH], rtol=1e-4, atol=1e-5)


def test_a_baselines_server_decoding_is_priced_from_what_the_server_reported_once_it_has():
    from bench.e2e.baselines import SERVED_LEAST, _served
    from bench.e2e.device import server_timing

    assert server_timing("decode;dur=0.412") == pytest.approx(4.12e-4)
    assert server_timing('cache;desc="x", decode;dur=1.5;desc=y') == pytest.approx(1.5e-3)
    assert server_timing("db;dur=3") is None and server_timing(None) is None
    b = Baseline("input-webp@75", "codec", 0, 0.005, codec="webp@75")
    calls = []
    assert _served(b, lambda: calls.append(1)) < 0.01 and calls  # no reports yet: timed here
    b.served.extend([3e-4, 5e-4][: SERVED_LEAST - 1])
    calls.clear()
    _served(b, lambda: calls.append(1))
    assert calls  # still too few
    b.served.extend([4e-4] * (SERVED_LEAST - 1))
    calls.clear()
    assert _served(b, lambda: calls.append(1)) == pytest.approx(4e-4) and not calls


def test_a_codecs_encode_is_priced_from_its_encodes_in_the_rounds_once_it_has_them():
    from bench.e2e.baselines import SERVED_LEAST, profile
    from qpart.client.image_offers import WINDOW

    pixels = np.random.default_rng(0).integers(0, 256, (2, 28, 28), dtype=np.uint8)
    view = SimpleNamespace(name="fmnist-cnn")
    b = Baseline("input-webp@75", "codec", 0, 0.005, codec="webp@75")
    profile(b, view, pixels, pixels[:1])
    assert 0 < b.host_local_s < 0.05  # no encodes in the rounds yet: this host's timing loop
    b.encoded.extend([0.25] * (SERVED_LEAST - 1))
    profile(b, view, pixels, pixels[:1])
    assert b.host_local_s < 0.05  # still too few
    b.encoded.extend([0.5] * WINDOW)  # the window holds the product device's last WINDOW
    profile(b, view, pixels, pixels[:1])
    assert b.host_local_s == pytest.approx(0.5) and len(b.encoded) == WINDOW


def test_every_codec_baseline_of_the_grid_can_encode_its_images(artifacts_dir):
    from PIL import Image

    from bench.e2e.baselines import encode_input, load_baselines
    from qpart.models.data import Split, load_split_pixels
    from qpart.models.image_codecs import encode_webp

    pixels = load_split_pixels(Split.TEST, 2)[0]
    for model in ("fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet"):
        artifact = load_artifact(artifacts_dir / model)
        for b in load_baselines(model, artifact=artifact):
            if b.kind == "codec":
                body = encode_input(pixels[0], b.codec)
                assert body
                if b.codec.startswith("webp@"):  # the product's encoder, whichever list it came from
                    assert body == encode_webp(Image.fromarray(pixels[0], "L"), int(b.codec[5:]))
    with pytest.raises(ValueError, match="no encoder"):
        encode_input(pixels[0], "avif@50")


def test_a_codecs_runs_record_their_encodes_for_the_next_price(cnn_only):
    from bench.e2e.baselines import SERVED_LEAST, profile, run_once
    from qpart.models.data import Split, load_split_pixels
    from tests.server.conftest import make_client

    artifact = load_artifact(cnn_only / "fmnist-cnn")
    view = ModelView("fmnist-cnn", artifact.version, len(artifact.cuts), [], [], artifact, [], [], 200)
    link = SimpleNamespace(wire=SimpleNamespace(quiet=lambda: None))
    pixels = load_split_pixels(Split.TEST, 4)[0]
    b = Baseline("input-png", "codec", 0, 0.0, codec="png")
    with make_client(cnn_only) as client:  # the product's input-image plan answers a PNG
        runs = [run_once(client, "", view, b, p, p, 3.0, link) for p in pixels[:SERVED_LEAST]]
    assert len(b.encoded) == SERVED_LEAST
    assert [r["local"] for r in runs] == pytest.approx([3.0 * s for s in b.encoded])
    assert all(r["upload_bytes"] > 0 for r in runs) and len(b.served) == SERVED_LEAST
    # the server time's parts are kept per run: the decode as the answer's Server-Timing said
    assert [r["decode"] for r in runs] == pytest.approx(list(b.served), abs=5e-7)
    assert all(r["server"] == pytest.approx(r["queue"] + r["compute"]) and r["compute"] >= r["decode"] > 0
               for r in runs)
    profile(b, view, pixels, pixels[:1])
    assert b.host_local_s == pytest.approx(float(np.median(b.encoded)))  # the runs price the next cell
