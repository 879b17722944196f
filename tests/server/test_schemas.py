"""Plan request schema: the upload codings a device offers, from both fields, and an inline
device profile's coding times in either schema's spelling (ADR 0008)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from qpart.kernels.coding import Coding
from qpart.profiles.devices import MAX_CUTS, DeviceProfile, get_device
from qpart.server.schemas import CostBreakdown, PlanRequest


def _request(**fields) -> PlanRequest:
    return PlanRequest.model_validate({"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                       "rate_bps": 1e6, **fields})


@pytest.mark.parametrize(("fields", "offered"), [
    ({}, set()),
    ({"upload_deflate": True}, {"deflate"}),
    ({"upload_deflate": False}, set()),
    ({"upload_codings": ["zstd"]}, {"zstd"}),
    ({"upload_codings": ["zstd"], "upload_deflate": True}, {"deflate", "zstd"}),
    ({"upload_codings": ["deflate"], "upload_deflate": True}, {"deflate"}),
    ({"upload_codings": ["zstd", "deflate"]}, {"deflate", "zstd"}),
])
def test_offered_codings_join_both_fields(fields, offered):
    assert _request(**fields).offered_codings() == offered


@pytest.mark.parametrize("codings", [["br"], ["deflate", "zstd", "deflate"], ["identity"]])
def test_unknown_or_too_many_codings_are_refused(codings):
    with pytest.raises(ValidationError, match="upload_codings"):
        _request(upload_codings=codings)


def test_the_offered_codings_read_the_same_from_json():
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "upload_codings": ["zstd"]}
    assert PlanRequest.model_validate_json(json.dumps(body)).offered_codings() == {Coding.ZSTD}


TIMES = [{"4": 1e-5}, {"4": 2e-5}]


@pytest.mark.parametrize("measured", [
    pytest.param({"deflate_s": TIMES, "zstd_s": TIMES}, id="schema-1-fields"),
    pytest.param({"coding_s": {"deflate": TIMES, "zstd": TIMES}}, id="schema-2-map"),
    pytest.param({"deflate_s": TIMES, "coding_s": {"zstd": TIMES}}, id="mixed"),
])
def test_an_inline_profile_carries_coding_times_in_either_spelling(measured):
    device = get_device("raspberry-pi-4").model_dump(mode="json", exclude_defaults=True)
    device["measured"] = {"fmnist-cnn": {"version": "v1", "head_s": [0.0, 1e-3], "warmup": 0, "repeats": 1,
                                         **measured}}
    req = _request(device=device, upload_codings=["deflate", "zstd"])
    assert isinstance(req.device, DeviceProfile)
    times = req.device.measured["fmnist-cnn"].coding_s
    assert times == {Coding.DEFLATE: [{4: 1e-5}, {4: 2e-5}], Coding.ZSTD: [{4: 1e-5}, {4: 2e-5}]}


def test_a_plan_reports_its_upload_encoding_as_a_coding_or_identity():
    zero = {"local": 0.0, "transfer": 0.0, "total": 0.0}
    costs = {"time_s": {**zero, "server": 0.0}, "energy_j": zero, "server_cost": 0.0, "objective": 0.0,
             "transfer_bytes": 0}
    assert CostBreakdown.model_validate(costs).upload_encoding == "identity"
    assert CostBreakdown.model_validate({**costs, "upload_encoding": "zstd"}).upload_encoding is Coding.ZSTD
    with pytest.raises(ValidationError, match="upload_encoding"):
        CostBreakdown.model_validate({**costs, "upload_encoding": "br"})


def test_an_inline_profile_over_a_list_cap_is_a_422_naming_field_and_cap(client):
    device = {**get_device("raspberry-pi-4").model_dump(mode="json"),
              "measured": {"fmnist-cnn": {"version": "v", "head_s": [1e-3] * (MAX_CUTS + 1),
                                          "warmup": 0, "repeats": 1}}}
    answer = client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                           "rate_bps": 1e6, "device": device})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert "measured.fmnist-cnn.head_s" in error and f"at most {MAX_CUTS} items" in error, error
