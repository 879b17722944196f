"""From a device's probes of its link to the two link figures its plan request carries.

A probe (:func:`bench.e2e.probe_exchange`) uploads a small and a large cut-0 packet, alternately,
on the link itself, and keeps each exchange's rest: the round trip less the server's reported
queue + compute. The cost model prices an exchange's rest as
``rtt + other_wire + max(0, body / rate - overlap)`` (``server.planner.price``), where the overlap
stands for the server's handling of a request that starts on its headers while the body is still
arriving.

- The overlap: the large body's extra wire time less its extra rest is the part of the extra
  that was hidden. When some was, the server's pre-body work outlasted the small body, and the
  overlap is the small body's wire time plus that part. When none was, the small body alone
  outlasted the work and the overlap is zero: any value up to the small body's wire time prices
  every upload at least that large the same, since the overhead below absorbs it.
- The overhead (``rtt``): the small exchange's rest less what the model prices its bytes at with
  that overlap.

So the model reproduces both probed exchanges (their medians). Where the hidden part is noise or
an error of the measured rate rather than server work, the overlap still fits the two
exchanges; between their sizes the model's error is at most that part.

A device smooths both over its last probes, as TCP smooths its RTT (:data:`PROBE_WINDOW`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# One probe alone read 3.95 ms where its cell's own exchanges implied 2.13 (5 Mbit/s, a
# transient on this shared machine; `python -m bench.e2e --rate 5 --model fmnist-cnn
# --cell-seconds 5`, console) and flipped the plan to all-device.
PROBE_WINDOW = 3


@dataclass(frozen=True)
class ExchangeProbe:
    """One probe, in seconds: median rest of the small exchange; median hidden part of the large
    body's extra wire time (may be negative: noise); that extra wire time; the small body's wire
    time. Body wire times are the cost model's (its activation bytes at the measured rate)."""

    small_rest_s: float
    hidden_s: float
    extra_wire_s: float
    small_body_s: float


def probe_medians(small_rests: Sequence[float], large_rests: Sequence[float],
                  small_body_s: float, large_body_s: float) -> ExchangeProbe:
    """An :class:`ExchangeProbe` from paired rests (small and large exchange of each pair)."""
    if not small_rests or len(small_rests) != len(large_rests):
        raise ValueError("a probe needs the same positive number of small and large exchanges")
    extra = large_body_s - small_body_s
    hidden = [extra - (large - small) for small, large in zip(small_rests, large_rests, strict=True)]
    return ExchangeProbe(statistics.median(small_rests), statistics.median(hidden), extra, small_body_s)


def fit_exchange(probes: Sequence[ExchangeProbe],
                 small_transfer_s: Callable[[float], float]) -> tuple[float, float]:
    """(rtt, overlap) in seconds from the medians over ``probes``.

    ``small_transfer_s(overlap)`` is what the cost model prices the small exchange's transfer at
    with no round trip and that overlap. The overlap is 0 or lies in (small body, large body];
    the overhead is never negative.
    """
    if not probes:
        raise ValueError("no probe to fit")
    hidden = statistics.median(p.hidden_s for p in probes)
    extra = statistics.median(p.extra_wire_s for p in probes)
    small_body = statistics.median(p.small_body_s for p in probes)
    overlap = 0.0 if hidden <= 0 else small_body + min(hidden, extra)
    rest = statistics.median(p.small_rest_s for p in probes)
    return max(rest - small_transfer_s(overlap), 0.0), overlap
