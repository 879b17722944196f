"""The timing profiler writes a profile the planner uses instead of the FLOP estimate."""

from __future__ import annotations

import pytest

from qpart.client.profiler import profile_device
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.devices import DeviceProfile, get_device
from qpart.server.planning.planner import encode_seconds, head_seconds


def test_profiler_times_every_cut_and_the_planner_prefers_it(artifacts_dir, tmp_path):
    artifact = load_artifact(artifacts_dir / "fmnist-cnn")
    profile = profile_device(get_device("raspberry-pi-4"), "fmnist-cnn", artifact.version,
                             name="this-box", repeats=3)
    measured = profile.measured["fmnist-cnn"].head_s
    assert len(measured) == len(artifact.cuts) and all(t >= 0 for t in measured)
    assert measured[-1] > measured[0]  # the whole model takes longer than the identity head
    path = tmp_path / "p.json"
    path.write_text(profile.model_dump_json())
    reloaded = DeviceProfile.model_validate_json(path.read_text())
    cut = artifact.cuts[-1]
    assert head_seconds(artifact, cut, reloaded) == measured[-1]
    assert head_seconds(artifact, cut, get_device("raspberry-pi-4")) == cut.head_flops / 5e9
    stale = reloaded.model_copy(update={"measured": {"fmnist-cnn": reloaded.measured["fmnist-cnn"]
                                                     .model_copy(update={"version": "other"})}})
    assert head_seconds(artifact, cut, stale) == cut.head_flops / 5e9  # other version: FLOPs


def test_encode_times_price_quantized_uploads_but_not_float_ones(artifacts_dir):
    artifact = load_artifact(artifacts_dir / "fmnist-cnn")
    profile = profile_device(get_device("raspberry-pi-4"), "fmnist-cnn", artifact.version, repeats=3)
    encode = profile.measured["fmnist-cnn"].encode_s
    assert len(encode) == len(artifact.cuts) - 1 and all(t > 0 for t in encode)
    quantized = next(p for p in artifact.patterns if p.cut == 1 and p.activation_bits < 32)
    lossless = next(p for p in artifact.patterns if p.cut == 1 and p.activation_bits == 32)
    assert encode_seconds(artifact, quantized, profile) == encode[1]
    assert encode_seconds(artifact, lossless, profile) == 0.0
    assert encode_seconds(artifact, quantized, get_device("raspberry-pi-4")) == 0.0  # not measured


def test_the_profiler_times_every_coding_at_every_cut_and_bits(artifacts_dir):
    from qpart.client.profiler import measure_codings
    from qpart.kernels.coding import CODING_BITS, Coding

    artifact = load_artifact(artifacts_dir / "fmnist-cnn")
    timed = measure_codings("fmnist-cnn", repeats=3)
    assert sorted(timed) == sorted(Coding)
    for times in timed.values():
        assert len(times) == len(artifact.cuts) - 1  # the last cut uploads nothing
        assert all(sorted(t) == sorted(CODING_BITS) and all(0 < v < 0.1 for v in t.values()) for t in times)


@pytest.mark.parametrize("coding", ["deflate", "zstd"])
def test_upload_body_compresses_only_when_the_plan_says_so(coding):
    from qpart.client.plans import PacketFormat
    from qpart.client.runtime import upload_body
    from qpart.kernels.coding import decode

    packet = b"QPA\x01" + bytes(400)
    sent = {"activation_bits": 8, "group_size": 4}
    body, headers = upload_body(PacketFormat.model_validate({**sent, "upload_encoding": coding}), packet)
    assert headers["Content-Encoding"] == coding and decode(body, coding, max_bytes=404) == packet
    assert len(body) < len(packet) / 4
    plain = (packet, {"Content-Type": "application/octet-stream"})
    assert upload_body(PacketFormat.model_validate({**sent, "upload_encoding": "identity"}), packet) == plain
    assert upload_body(PacketFormat.model_validate(sent), packet)[0] is packet
