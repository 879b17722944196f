"""Plan request schema: the upload codings a device offers, from both fields, and the coding
names the schema, the kernels, the profiles and the device client agree on."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from client.settings import DeviceSettings
from kernels.coding import Coding
from profiles.artifacts import CutProfile
from profiles.codings import UPLOAD_CODINGS, coding_field
from profiles.devices import MeasuredHeads
from server.schemas import PlanRequest, UploadCoding, UploadEncoding


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


def test_every_layer_names_the_same_codings():
    names = {c.value for c in Coding}
    assert set(get_args(UploadCoding)) == names
    assert set(get_args(UploadEncoding)) == names | {"identity"}
    settings_type = DeviceSettings.model_fields["upload_codings"].annotation
    assert set(get_args(get_args(settings_type)[0])) == names
    assert set(UPLOAD_CODINGS) == names  # and each has its figures' fields in the profiles
    assert {coding_field(c, "ratio") for c in names} <= set(CutProfile.model_fields)
    assert {coding_field(c, "s") for c in names} <= set(MeasuredHeads.model_fields)
