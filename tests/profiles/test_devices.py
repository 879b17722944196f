"""Device profiles bound every list and name they hold (an inline profile is request data), and the
bounds fit real profiles: the shipped presets and a profile measured for the largest shipped model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from qpart.profiles.artifacts import load_artifact
from qpart.profiles.devices import MAX_CUTS, DeviceProfile, builtin_devices
from qpart.server.settings import ServerSettings
from tests.conftest import REPO

BASE = {"name": "d", "flops_per_s": 1e9, "power_compute_w": 1.0, "power_tx_w": 1.0}
BITS = {b: 1e-4 for b in (1, 2, 3, 4, 5, 6, 7, 8, 32)}  # what `qpart device profile` measures


def _measured(cuts: int, **extra: object) -> dict[str, object]:
    return {"version": "e68e9ded413c", "head_s": [1e-3] * cuts, "encode_s": [1e-5] * cuts,
            "coding_s": {"deflate": [BITS] * cuts, "zstd": [BITS] * cuts}, "warmup": 1, "repeats": 3,
            **extra}


def _largest_shipped_cuts() -> int:
    return max(len(load_artifact(p).cuts) for p in (REPO / "artifacts").glob("*/artifact.json"))


@pytest.mark.parametrize("field", ["head_s", "encode_s", "coding_s"])
def test_a_per_cut_list_over_the_cap_is_refused_naming_field_and_cap(field):
    too_long = _measured(MAX_CUTS)
    too_long[field] = ({"deflate": [BITS] * (MAX_CUTS + 1)} if field == "coding_s"
                       else [1e-3] * (MAX_CUTS + 1))
    with pytest.raises(ValidationError) as caught:
        DeviceProfile.model_validate({**BASE, "measured": {"m": too_long}})
    (error,) = caught.value.errors()
    assert field in error["loc"] and error["type"] == "too_long"
    assert f"at most {MAX_CUTS} items" in error["msg"]


@pytest.mark.parametrize(("profile", "field"), [
    ({**BASE, "sources": ["x" * 501]}, "sources"),
    ({**BASE, "measured": {"m" * 65: _measured(2)}}, "measured"),
    ({**BASE, "measured": {"m": _measured(2, version="v" * 65)}}, "version"),
])
def test_names_and_notes_are_bounded(profile, field):
    with pytest.raises(ValidationError) as caught:
        DeviceProfile.model_validate(profile)
    assert any(field in map(str, e["loc"]) for e in caught.value.errors()), caught.value


def test_the_caps_fit_the_shipped_presets_and_models():
    assert builtin_devices()  # every preset still loads
    cuts = _largest_shipped_cuts()
    assert cuts <= MAX_CUTS
    measured = {f"m{i}": _measured(cuts) for i in range(64)}
    profile = DeviceProfile.model_validate({**BASE, "measured": measured})
    assert len(profile.measured) == 64


def test_an_inline_profile_of_many_measured_models_fits_the_plan_body_limit():
    """As the device sends it (schema 1's spelling, ADR 0008): every model the profile may hold at
    the largest shipped model's cut count, or 16 models at the cap."""
    limit = ServerSettings().max_plan_body_bytes
    for models, cuts in ((64, _largest_shipped_cuts()), (16, MAX_CUTS)):
        profile = DeviceProfile.model_validate(
            {**BASE, "measured": {f"model-{i:02d}": _measured(cuts) for i in range(models)}})
        doc = profile.model_dump(mode="json", exclude_defaults=True)
        doc["measured"] = {m: heads.schema1_json() for m, heads in profile.measured.items()}
        body = json.dumps({"model": "model-00", "accuracy_demand": 0.01, "rate_bps": 1e6, "device": doc})
        assert len(body) < limit, (models, cuts, len(body))
