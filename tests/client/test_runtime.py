"""The device runtime's plan request: which upload codings it offers and how it sends its profile
(in schema 1's spelling, ADR 0008, so servers from before zstd uploads, ADR 0007, still accept it);
the deprecated settings alias."""

from __future__ import annotations

import json
import warnings

import httpx
import pytest

from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels.coding import Coding
from qpart.profiles.devices import DeviceProfile, MeasuredHeads, get_device
from tests.client.samples import PLAN

CODED = [dict.fromkeys([*range(1, 9), 32], 1e-4)] * 3
DEFLATE, ZSTD = Coding.DEFLATE, Coding.ZSTD


def _profile(*codings: Coding) -> DeviceProfile:
    heads = MeasuredHeads(version="v1", head_s=[0.0, 1e-3, 2e-3], warmup=0, repeats=1,
                          coding_s=dict.fromkeys(codings, CODED))
    return get_device("raspberry-pi-4").model_copy(update={"measured": {"fmnist-cnn": heads}})


def _plan_body(tmp_path, profile: DeviceProfile | None, **settings) -> dict:
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=PLAN)

    conf = DeviceSettings(server="http://qpart.test", cache_dir=tmp_path, **settings)
    client = httpx.Client(base_url=conf.server, transport=httpx.MockTransport(handler))
    runtime = DeviceRuntime(conf, device_profile=profile, transport=Transport(conf, client=client))
    runtime.plan("fmnist-cnn", 0.01, rate_bps=1e6)
    return sent[0]


@pytest.mark.parametrize(("codings", "settings", "expected"), [
    pytest.param((), {}, {}, id="no-coding-times"),
    pytest.param((DEFLATE,), {}, {"upload_deflate": True}, id="deflate-only-old-field"),
    pytest.param((ZSTD,), {}, {"upload_codings": ["zstd"]}, id="zstd-only"),
    pytest.param((DEFLATE, ZSTD), {}, {"upload_codings": ["deflate", "zstd"]}, id="both"),
    pytest.param((DEFLATE, ZSTD), {"upload_codings": ("zstd",)}, {"upload_codings": ["zstd"]},
                 id="settings-narrow"),
    pytest.param((DEFLATE, ZSTD), {"upload_codings": ()}, {}, id="settings-none"),
])
def test_the_plan_offers_only_the_codings_both_the_settings_and_the_profile_have(
        tmp_path, codings, settings, expected):
    body = _plan_body(tmp_path, _profile(*codings), **settings)
    offered = {k: body[k] for k in ("upload_deflate", "upload_codings") if k in body}
    assert offered == expected


def test_without_a_profile_no_coding_is_offered(tmp_path):
    body = _plan_body(tmp_path, None)
    assert "upload_codings" not in body and "upload_deflate" not in body


def test_the_inline_profile_leaves_out_empty_fields_an_older_server_would_refuse(tmp_path):
    body = _plan_body(tmp_path, _profile(DEFLATE))
    measured = body["device"]["measured"]["fmnist-cnn"]
    assert "zstd_s" not in measured and "coding_s" not in measured and len(measured["deflate_s"]) == 3
    assert "schema_version" not in body["device"]  # a default: a server of schema 1 takes its own
    # and the server side reads it back to the same profile
    assert DeviceProfile.model_validate(body["device"]) == _profile(DEFLATE)


def test_a_deflate_only_device_sends_nothing_a_server_from_before_zstd_would_refuse(tmp_path):
    # A profile written now holds zstd times; settings offering deflate alone keep them home.
    body = _plan_body(tmp_path, _profile(DEFLATE, ZSTD), upload_codings=("deflate",))
    assert body["upload_deflate"] is True and "upload_codings" not in body
    measured = body["device"]["measured"]["fmnist-cnn"]
    assert "zstd_s" not in measured and len(measured["deflate_s"]) == 3


def test_no_coding_offered_sends_no_coding_times(tmp_path):
    body = _plan_body(tmp_path, _profile(DEFLATE, ZSTD), upload_codings=())
    assert not {"deflate_s", "zstd_s", "coding_s"} & set(body["device"]["measured"]["fmnist-cnn"])


def test_a_coding_named_twice_in_the_settings_is_offered_once(tmp_path):
    conf = DeviceSettings(upload_codings=("zstd", "deflate", "zstd"), cache_dir=tmp_path)
    assert conf.upload_codings == ("zstd", "deflate")


@pytest.mark.parametrize(("value", "expected"), [
    ("false", ()), ("0", ()), ("true", ("deflate",)), ("ON", ("deflate",)),
])
def test_the_deprecated_upload_deflate_variable_keeps_its_meaning_with_a_visible_warning(
        monkeypatch, value, expected):
    monkeypatch.setenv("QPART_DEVICE_UPLOAD_DEFLATE", value)
    monkeypatch.delenv("QPART_DEVICE_UPLOAD_CODINGS", raising=False)
    with pytest.warns(FutureWarning, match="QPART_DEVICE_UPLOAD_CODINGS"):  # shown by default
        assert DeviceSettings().upload_codings == expected


def test_upload_codings_wins_over_the_deprecated_variable(monkeypatch):
    monkeypatch.setenv("QPART_DEVICE_UPLOAD_DEFLATE", "false")
    monkeypatch.setenv("QPART_DEVICE_UPLOAD_CODINGS", '["zstd"]')
    with pytest.warns(FutureWarning, match="ignored"):
        assert DeviceSettings().upload_codings == ("zstd",)


def test_a_deprecated_variable_that_is_not_a_boolean_is_refused(monkeypatch):
    monkeypatch.setenv("QPART_DEVICE_UPLOAD_DEFLATE", "maybe")
    with warnings.catch_warnings(), pytest.raises(ValueError, match="QPART_DEVICE_UPLOAD_CODINGS"):
        DeviceSettings()


def test_an_unknown_coding_in_the_settings_is_refused(monkeypatch):
    monkeypatch.setenv("QPART_DEVICE_UPLOAD_CODINGS", '["brotli"]')
    with pytest.raises(ValueError, match="upload_codings"):
        DeviceSettings()


def test_a_with_block_closes_the_connections(tmp_path):
    settings = DeviceSettings(server="http://127.0.0.1:9", cache_dir=tmp_path)
    with DeviceRuntime(settings, device="jetson-nano") as runtime:
        assert not runtime.transport.client.is_closed
    assert runtime.transport.client.is_closed
