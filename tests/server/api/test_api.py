"""The /v1 routes in process: planning, segments, tail inference, errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from qpart.client.plans import HeadSpec, PacketFormat, PlanResponse
from qpart.client.runtime import encode_for_plan, load_head
from qpart.models.data import Split, load_split
from qpart.models.registry import get_model
from qpart.server.api.app import create_app
from qpart.server.settings import ServerSettings
from tests.conftest import first_middle_cut
from tests.server.conftest import make_client, slow_decoding


def _plan(client, **changes):
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 5e6, "device": "raspberry-pi-4"}
    body.update(changes)
    response = client.post("/v1/plan", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_plan_returns_costs_and_baselines(client):
    plan = _plan(client)
    assert plan["level"] <= 0.01
    for key in ("predicted", "all_server", "all_device"):
        t = plan[key]["time_s"]
        assert t["total"] == pytest.approx(t["local"] + t["transfer"] + t["server"])
    assert plan["predicted"]["objective"] <= plan["all_server"]["objective"] + 1e-12
    assert plan["predicted"]["objective"] <= plan["all_device"]["objective"] + 1e-12


def test_an_upload_overlap_prices_the_same_upload_cheaper(client):
    plain = _plan(client, rate_bps=1e5)
    hidden = _plan(client, rate_bps=1e5, upload_overlap_s=0.005)
    # The all-server plan uploads the input: its transfer sheds the hidden 5 ms (its body takes longer).
    before, after = plain["all_server"]["time_s"]["transfer"], hidden["all_server"]["time_s"]["transfer"]
    assert after == pytest.approx(before - 0.005)


def test_an_upload_rate_prices_the_upload_body_at_that_rate(client):
    plain = _plan(client, rate_bps=1e5, accuracy_demand=0.0001)
    faster = _plan(client, rate_bps=1e5, accuracy_demand=0.0001, upload_rate_bps=2e5)
    # lossless only: all-server uploads the 28x28 float32 input (3,136 B); half its body time is gone
    before, after = plain["all_server"]["time_s"]["transfer"], faster["all_server"]["time_s"]["transfer"]
    assert after == pytest.approx(before - 3136 * 8 / 1e5 / 2)


def test_a_demand_tighter_than_every_level_gets_a_lossless_plan(client):
    plan = _plan(client, accuracy_demand=0.0001)
    assert plan["level"] == 0
    assert all(b == 32 for b in plan["weight_bits"].values()) and plan["activation_bits"] == 32


@pytest.mark.parametrize("demand", [0.001, 0.0025, 0.005, 0.01, 0.02, 0.5])
def test_plans_are_never_looser_than_the_demand(client, demand):
    assert _plan(client, accuracy_demand=demand)["level"] <= demand


def test_an_impossible_deadline_is_a_422_naming_the_fastest_time(client):
    response = client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                             "rate_bps": 1e3, "deadline_s": 1e-6})
    assert response.status_code == 422
    assert "fastest achievable" in response.json()["error"]


def test_a_met_deadline_picks_the_most_accurate_plan(client):
    loose = _plan(client, accuracy_demand=0.02, rate_bps=1e9, deadline_s=10.0)
    assert loose["level"] == 0  # the lossless plan meets a generous deadline: most accurate wins


def test_held_segments_cost_no_transfer(client):
    held_plan = _segment_plan(client)
    assert held_plan["segment"]["held"] is True
    cold = _plan(client, rate_bps=1e4, device="jetson-nano", accuracy_demand=held_plan["level"])
    # Without the segment in hand the same cut would have to download it: the planner chose otherwise.
    assert held_plan["predicted"]["transfer_bytes"] <= cold["predicted"]["transfer_bytes"]
    info = client.get("/v1/models/fmnist-cnn").json()
    seg = next(p["segment"] for p in info["patterns"] if p["pattern_id"] in held_plan["plan_id"])
    assert held_plan["predicted"]["transfer_bytes"] < seg["size_bytes"]


def test_unknown_model_is_a_404_with_an_error_body(client):
    response = client.post("/v1/plan", json={"model": "nope", "accuracy_demand": 0.01, "rate_bps": 1e6})
    assert response.status_code == 404
    assert "unknown model 'nope'" in response.json()["error"]


@pytest.mark.parametrize("body", [
    {}, {"model": "fmnist-cnn"}, {"model": "fmnist-cnn", "accuracy_demand": 2, "rate_bps": 1},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": -5},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "device": {"name": "x"}},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "batch": True},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "surprise": 1},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "upload_overlap_s": -0.001},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "upload_overlap_s": 5},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "upload_rate_bps": 0},
    {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "upload_rate_bps": 1e13},
])
def test_malformed_plans_are_4xx_with_an_error_body(client, body):
    response = client.post("/v1/plan", json=body)
    assert 400 <= response.status_code < 500
    assert set(response.json()) == {"error"}


def test_unknown_device_profile_is_a_400(client):
    response = client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                             "rate_bps": 1e6, "device": "toaster"})
    assert response.status_code == 400 and "raspberry-pi-4" in response.json()["error"]


def _segment_plan(client, cut=None):
    """A plan with a head segment: hold a deep cut's segment, so the planner prefers it."""
    info = client.get("/v1/models/fmnist-cnn").json()
    chosen = [p for p in info["patterns"] if p["segment"] and p["level"] == 0.01
              and (cut is None or p["cut"] == cut)]
    held = [p["segment"]["id"] for p in chosen]
    plan = _plan(client, rate_bps=1e4, device="jetson-nano", held_segments=held)
    assert plan["segment"] is not None and plan["segment"]["held"], plan
    return plan


def test_segment_has_strong_etag_304_and_range(client):
    seg = _segment_plan(client)["segment"]
    full = client.get(seg["url"])
    assert full.status_code == 200
    assert hashlib.sha256(full.content).hexdigest() == seg["id"] == seg["sha256"]
    assert full.headers["etag"] == f'"{seg["id"]}"'
    assert "immutable" in full.headers["cache-control"]
    assert "gzip" not in full.headers.get("content-encoding", "")
    assert client.get(seg["url"], headers={"If-None-Match": f'"{seg["id"]}"'}).status_code == 304
    part = client.get(seg["url"], headers={"Range": "bytes=10-99"})
    assert part.status_code == 206 and part.content == full.content[10:100]
    assert part.headers["content-range"] == f"bytes 10-99/{len(full.content)}"
    tail = client.get(seg["url"], headers={"Range": f"bytes={len(full.content) - 5}-"})
    assert tail.content == full.content[-5:]
    assert client.get(seg["url"], headers={"Range": f"bytes={len(full.content)}-"}).status_code == 416


def test_segment_head_gives_the_get_headers_without_a_body(client):
    seg = _segment_plan(client)["segment"]
    full = client.get(seg["url"])
    head = client.head(seg["url"])
    assert head.status_code == 200 and head.content == b""
    for name in ("etag", "content-length", "cache-control", "accept-ranges", "content-type"):
        assert head.headers[name] == full.headers[name], name
    assert int(head.headers["content-length"]) == seg["size_bytes"]
    part = client.head(seg["url"], headers={"Range": "bytes=10-99"})
    assert part.status_code == 206 and part.content == b""
    assert part.headers["content-range"] == f"bytes 10-99/{seg['size_bytes']}"
    assert part.headers["content-length"] == "90"
    assert client.head(seg["url"], headers={"If-None-Match": f'"{seg["id"]}"'}).status_code == 304
    beyond = client.head(seg["url"], headers={"Range": f"bytes={seg['size_bytes']}-"})
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{seg['size_bytes']}"
    assert client.head("/v1/segments/" + "0" * 64).status_code == 404


def test_a_head_request_neither_builds_nor_caches_a_segment(client):
    seg = _segment_plan(client)["segment"]
    before = client.get("/metrics").text
    assert client.head(seg["url"]).status_code == 200
    after = client.get("/metrics").text
    for family in ("qpart_segment_cache_hits_total", "qpart_segment_cache_misses_total",
                   "qpart_segment_cache_resident_bytes", "qpart_segment_cache_entries"):
        lines = [[row for row in text.splitlines() if row.startswith(family)] for text in (before, after)]
        assert lines[0] == lines[1] and lines[0], family


def test_unknown_segment_is_404(client):
    assert client.get("/v1/segments/" + "0" * 64).status_code == 404
    assert client.get("/v1/segments/not-a-hash").status_code == 422


def _pattern_as_plan(client, cut, level=0.01):
    info = client.get("/v1/models/fmnist-cnn").json()
    p = next(p for p in info["patterns"] if p["cut"] == cut and p["level"] == level)
    return {**p, "model": info["model"], "version": info["version"], "cuts": info["cuts"]}


@pytest.fixture(scope="module")
def every_cut_client(every_cut):
    with make_client(every_cut) as c:
        yield c


@pytest.mark.parametrize(("artifacts", "cut"), [("committed", 0), ("committed", "middle"),
                                                ("every-cut", 3), ("every-cut", 6)])
def test_tail_inference_matches_the_split_model(client, every_cut_client, artifacts, cut):
    client = client if artifacts == "committed" else every_cut_client
    if cut == "middle":  # the committed artifact's first calibrated cut between the input and the output
        info = client.get("/v1/models/fmnist-cnn").json()
        cut = first_middle_cut(info)
    plan = _pattern_as_plan(client, cut)
    segment = client.get(plan["segment"]["url"]).content if plan["segment"] else None
    head = load_head(HeadSpec.model_validate(plan), segment)
    test = load_split(Split.TEST, limit=40)
    with torch.inference_mode():
        act = head(torch.from_numpy(test.images)).numpy()
    response = client.post(plan["infer_url"], content=encode_for_plan(act, PacketFormat.model_validate(plan)))
    assert response.status_code == 200, response.text
    preds = [r["top_k"][0]["label"] for r in response.json()["results"]]
    assert np.mean(np.array(preds) == test.labels) > 0.85
    labels = get_model("fmnist-cnn").labels
    assert labels is not None and labels[0] == "T-shirt/top"
    for result in response.json()["results"]:  # each class's card name beside its index
        assert all(t["name"] == labels[t["label"]] for t in result["top_k"])


@pytest.mark.parametrize("body", [b"", b"garbage", b"QPA\x01" + bytes(40), b"\x00" * 1000])
def test_garbage_activation_is_a_400(client, body):
    plan = _plan(client)
    if plan["infer_url"] is None:
        pytest.skip("all-device plan")
    response = client.post(plan["infer_url"], content=body)
    assert response.status_code == 400 and "activation" in response.json()["error"]


def test_wrong_bits_for_the_plan_are_a_400(client):
    plan = _plan(client)
    shape = [2, *plan["activation_shape"]]
    wrong = dict(plan, activation_bits=8 if plan["activation_bits"] != 8 else 4)
    packet = encode_for_plan(np.random.rand(*shape).astype(np.float32), PlanResponse.model_validate(wrong))
    response = client.post(plan["infer_url"], content=packet)
    assert response.status_code == 400 and "requires" in response.json()["error"]


def test_unknown_route_and_method_use_the_error_body(client):
    assert client.get("/nope").json()["error"].startswith("no route")
    response = client.get("/v1/plan")
    assert response.status_code == 405 and "error" in response.json()


def test_oversize_body_is_a_413(cnn_only):
    with make_client(cnn_only, max_body_bytes=2048) as c:
        response = c.post("/v1/plan", content=b"x" * 5000, headers={"content-type": "application/json"})
        assert response.status_code == 413 and "limit" in response.json()["error"]


def test_bearer_token_guards_inference_routes(cnn_only):
    with make_client(cnn_only, auth_token="s3cret") as c:
        body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6}
        denied = c.post("/v1/plan", json=body)
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/plan", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/v2/health/ready").status_code == 200  # probes stay open


def _any_segment(client, headers):
    info = client.get("/v1/models/fmnist-cnn", headers=headers).json()
    return next(p["segment"] for p in info["patterns"] if p["segment"])


def test_an_empty_credential_never_passes(cnn_only):
    with make_client(cnn_only, auth_token="s3cret", admin_token="adm") as c:
        body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6}
        for empty in ("Bearer", "Bearer ", "Bearer    ", "bearer\t", ""):
            assert c.post("/v1/plan", json=body, headers={"Authorization": empty}).status_code == 401
            admin = c.put("/v1/admin/segment-cache", json={"budget_bytes": 0},
                          headers={"Authorization": empty})
            assert admin.status_code == 401, empty


@pytest.mark.parametrize("empty", ["", " ", "\t\n"])
@pytest.mark.parametrize("field", ["auth_token", "admin_token"])
def test_an_empty_or_blank_token_is_a_configuration_error(cnn_only, field, empty):
    with pytest.raises(ValidationError, match="empty or whitespace-only token"):
        ServerSettings(artifacts=cnn_only, **{field: empty})


def test_segments_and_model_listings_need_the_token_unless_configured_public(cnn_only):
    token = {"Authorization": "Bearer s3cret"}
    with make_client(cnn_only, auth_token="s3cret") as c:
        seg = _any_segment(c, token)
        for path in ("/v1/models/fmnist-cnn", seg["url"], "/v2/models/fmnist-cnn",
                     "/v2/models/fmnist-cnn-tail"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers=token).status_code == 200, path
        assert c.head(seg["url"]).status_code == 401
        assert c.get("/v2/models/fmnist-cnn/ready").status_code == 200  # probes stay open
    with make_client(cnn_only, auth_token="s3cret", protect_models=False) as c:
        seg = _any_segment(c, token)
        for path in ("/v1/models/fmnist-cnn", seg["url"], "/v2/models/fmnist-cnn"):
            assert c.get(path).status_code == 200, path
        assert c.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                        "rate_bps": 1e6}).status_code == 401  # inference still guarded


def test_cache_budget_changes_at_run_time_with_the_admin_token(cnn_only):
    with make_client(cnn_only, admin_token="adm") as c:
        auth = {"Authorization": "Bearer adm"}
        response = c.put("/v1/admin/segment-cache", json={"budget_bytes": 0}, headers=auth)
        assert response.json() == {"budget_bytes": 0, "resident_bytes": 0}
        assert c.put("/v1/admin/segment-cache", json={"budget_bytes": 0}).status_code == 401


def test_admin_api_is_disabled_without_a_token(client):
    response = client.put("/v1/admin/segment-cache", json={"budget_bytes": 0})
    assert response.status_code == 403 and "QPART_ADMIN_TOKEN" in response.json()["error"]


def test_416_names_the_size_and_weak_etags_match(client):
    seg = _segment_plan(client)["segment"]
    bad = client.get(seg["url"], headers={"Range": "bytes=99999999-"})
    assert bad.status_code == 416 and bad.headers["content-range"] == f"bytes */{seg['size_bytes']}"
    assert client.get(seg["url"], headers={"If-None-Match": f'W/"{seg["id"]}"'}).status_code == 304


def test_extreme_but_finite_figures_never_give_a_500(client):
    response = client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                             "rate_bps": 1.0, "device": {"name": "slow", "flops_per_s": 1e3,
                                                                          "power_compute_w": 1e3,
                                                                          "power_tx_w": 1e3}})
    assert response.status_code in (200, 422)


def test_plan_requests_are_counted_under_their_model(cnn_only):
    with make_client(cnn_only) as c:
        _plan(c)
        unknown = {"model": "nope", "accuracy_demand": 0.01, "rate_bps": 1e6}
        assert c.post("/v1/plan", json=unknown).status_code == 404
        text = c.get("/metrics").text
        assert 'qpart_requests_total{model="fmnist-cnn",outcome="ok",route="plan"} 1.0' in text
        assert 'qpart_requests_total{model="unknown",outcome="client_error",route="plan"} 1.0' in text


@pytest.mark.parametrize("on", [False, True])
def test_fastapis_native_opentelemetry_follows_the_setting(cnn_only, on):
    app = create_app(ServerSettings(artifacts=cnn_only, opentelemetry=on))
    assert {k: app._telemetry[k] for k in ("tracing", "metrics", "logs")} == dict.fromkeys(
        ("tracing", "metrics", "logs"), on)


def test_a_deflated_upload_answers_as_the_plain_one_and_bad_codings_are_4xx(client):
    import zlib

    import zstandard

    from qpart.kernels.coding import deflate, zstd_compress

    plan = _plan(client, rate_bps=1e6)
    packet = encode_for_plan(load_split(Split.TEST, limit=1).images, PlanResponse.model_validate(plan))
    plain = client.post(plan["infer_url"], content=packet).json()
    coded = client.post(plan["infer_url"], content=deflate(packet), headers={"Content-Encoding": "deflate"})
    assert coded.status_code == 200 and coded.json()["results"] == plain["results"]
    zst = client.post(plan["infer_url"], content=zstd_compress(packet), headers={"Content-Encoding": "zstd"})
    assert zst.status_code == 200 and zst.json()["results"] == plain["results"]
    unsupported = client.post(plan["infer_url"], content=packet, headers={"Content-Encoding": "gzip"})
    assert unsupported.status_code == 415 and "deflate" in unsupported.json()["error"]
    coded_header = {"Content-Encoding": "deflate"}
    broken = client.post(plan["infer_url"], content=b"\x78\x9cgarbage", headers=coded_header)
    assert broken.status_code == 400 and "deflate" in broken.json()["error"]
    bomb = zlib.compress(b"\0" * (9 << 20), 9)  # inflates past the 8 MiB body limit
    big = client.post(plan["infer_url"], content=bomb, headers={"Content-Encoding": "deflate"})
    assert big.status_code == 413 and "decodes past" in big.json()["error"]
    zbomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (9 << 20))
    zbig = client.post(plan["infer_url"], content=zbomb, headers={"Content-Encoding": "zstd"})
    assert zbig.status_code == 413 and "decodes past" in zbig.json()["error"]
    # a frame that does not declare its size is cut off by the bounded reader, not inflated whole
    unsized = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(b"\0" * (9 << 20))
    assert zstandard.frame_content_size(unsized) == -1
    zbig = client.post(plan["infer_url"], content=unsized, headers={"Content-Encoding": "zstd"})
    assert zbig.status_code == 413 and "decodes past" in zbig.json()["error"]
    zbroken = client.post(plan["infer_url"], content=b"\x28\xb5\x2f\xfdgarbage",
                          headers={"Content-Encoding": "zstd"})
    assert zbroken.status_code == 400 and "zstd" in zbroken.json()["error"]


def test_a_device_with_deflate_times_is_told_to_deflate_on_a_slow_link(client):
    from qpart.profiles.devices import MeasuredHeads, get_device

    info = client.get("/v1/models/fmnist-cnn").json()
    pi = get_device("raspberry-pi-4")
    measured = MeasuredHeads(version=info["version"], head_s=[1e-3] * info["cuts"],
                             coding_s={"deflate": [dict.fromkeys([*range(1, 9), 32], 2e-4)] * info["cuts"]},
                             warmup=0, repeats=1)
    device = pi.model_copy(update={"measured": {"fmnist-cnn": measured}}).model_dump(mode="json")
    slow = _plan(client, rate_bps=1e5, device=device, upload_deflate=True)
    assert slow["upload_encoding"] == "deflate" and slow["predicted"]["upload_encoding"] == "deflate"
    assert _plan(client, rate_bps=1e5, device=device)["upload_encoding"] == "identity"  # not offered
    assert _plan(client, rate_bps=1e10, device=device, upload_deflate=True)["upload_encoding"] == "identity"
    both = _plan(client, rate_bps=1e5, device=device, upload_codings=["zstd", "deflate"])
    assert both["upload_encoding"] == "deflate"  # the profile has no zstd times


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "router"])
def test_a_packets_decoding_is_server_time_and_named_in_server_timing(cnn_only, monkeypatch, fast_path):
    """Undoing the Content-Encoding and dequantizing the packet are server work: in compute_s and in
    ``Server-Timing: decode``, as an input-image plan's decoding is, so that a client that counts
    the rest of its round trip as transfer counts no server work there."""
    from qpart.kernels.coding import zstd_compress

    slow_decoding(monkeypatch, 0.03, 0.02)
    with make_client(cnn_only, inference_fast_path=fast_path) as c:
        plan = _plan(c, rate_bps=1e6)
        packet = encode_for_plan(load_split(Split.TEST, limit=1).images, PlanResponse.model_validate(plan))
        coded = zstd_compress(packet)
        for body, headers, least in [(packet, {}, 0.02), (coded, {"Content-Encoding": "zstd"}, 0.05)]:
            r = c.post(plan["infer_url"], content=body, headers=headers)
            assert r.status_code == 200, r.text
            metric, _, ms = r.headers["server-timing"].partition(";dur=")
            decode_s = float(ms) / 1e3
            assert metric == "decode" and least <= decode_s < least + 0.05
            assert r.json()["compute_s"] >= decode_s  # the tail's own compute comes on top
