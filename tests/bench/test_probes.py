"""bench.e2e.probes: the requests that set the prices a sitting plans with."""

from __future__ import annotations

from types import SimpleNamespace

from bench.e2e import ModelView
from bench.e2e.probes import prime_prices
from qpart.models.data import Split, load_split
from qpart.profiles.artifacts import load_artifact
from qpart.server.tail_times import CUT_WINDOW
from tests.server.conftest import make_client


def test_priming_sends_a_windows_worth_of_lone_cut0_packets_each_after_the_devices_work(cnn_only):
    events: list[str] = []
    link = SimpleNamespace(wire=SimpleNamespace(quiet=lambda: events.append("quiet")))
    artifact = load_artifact(cnn_only / "fmnist-cnn")
    image = load_split(Split.TEST, limit=1).images
    with make_client(cnn_only) as client:
        info = client.get("/v1/models/fmnist-cnn").json()
        view = ModelView("fmnist-cnn", artifact.version, len(artifact.cuts), info["server_tail_s"],
                         info["patterns"], artifact, [], [], info["answer_bytes"])
        assert info["server_decode_s"]["identity"][0] == 0.0  # no packet served yet
        prime_prices(client, "", view, image, link, lambda: events.append("work"))
        after = client.get("/v1/models/fmnist-cnn").json()
        metrics = client.get("/metrics").text
    assert events == ["work", "quiet"] * CUT_WINDOW  # the device's work first, then a quiet link
    assert after["server_decode_s"]["identity"][0] > 0  # the server priced its decoding from them
    served = [line for line in metrics.splitlines() if line.startswith("qpart_tail_batch_size_count")
              and 'model="fmnist-cnn"' in line]
    assert served and float(served[0].rsplit(" ", 1)[1]) >= CUT_WINDOW
