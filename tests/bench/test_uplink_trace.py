"""bench.e2e.analyses.uplink_trace's reading of tcpdump lines into per-request milestones."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.e2e.analyses.uplink import PORT
from bench.e2e.analyses.uplink_trace import _segments, timeline

S = f"127.0.0.1.{PORT}"  # the server's end
LINES = [
    "100.000100000 IP 127.0.0.1.40000 > 127.0.0.1.50000: UDP, length 1472",  # filler: not ours
    f"100.000200000 IP 127.0.0.1.33000 > {S}: Flags [P.], seq 1:248, ack 1, length 247",
    f"100.000500000 IP 127.0.0.1.33000 > {S}: Flags [.], seq 248:1696, ack 1, length 1448",
    f"100.000600000 IP {S} > 127.0.0.1.33000: Flags [.], ack 1696, length 0",  # bare ACK
    f"100.000700000 IP 127.0.0.1.33000 > {S}: Flags [P.], seq 1696:1900, ack 1, length 204",
    f"100.002000000 IP {S} > 127.0.0.1.33000: Flags [P.], seq 1:127, ack 1900, length 126",
    f"100.002100000 IP {S} > 127.0.0.1.33000: Flags [P.], seq 127:760, ack 1900, length 633",
    "reading from file trace.pcap, link-type EN10MB (Ethernet)",
    f"100.0029 IP {S} > 127.0.0.1.33000: Flags [P.], seq 760:761, ack 1900, length lots",  # not a number
    f"100.0029 IP6 ::1.{PORT} > ::1.33000: Flags [P.], seq 1:2, ack 1, length 1",  # not IPv4: not ours
    "",
]


def test_segments_keep_data_to_and_from_the_server_only():
    got = _segments(LINES)
    assert [(kind, size) for _, kind, size in got] == [
        ("req", 247), ("req", 1448), ("req", 204), ("resp", 126), ("resp", 633)]


def test_a_timeline_measures_from_the_headers():
    t = timeline(_segments(LINES), 100.0, 100.003)
    assert t == pytest.approx({"body_end_after_headers_s": 0.0005, "answer_after_body_end_s": 0.0013,
                               "answer_after_headers_s": 0.0018})


def test_a_window_without_an_answer_has_no_timeline():
    assert timeline(_segments(LINES), 100.0, 100.001) is None


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=120), max_size=20))
def test_segments_never_fail_on_arbitrary_lines(lines):
    for stamp, kind, size in _segments(lines):
        assert kind in ("req", "resp") and size > 0 and math.isfinite(stamp)
