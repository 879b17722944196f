"""From a device's probes of its link to the two link figures its plan request carries.

A probe (:func:`bench.e2e.probe_exchange`) uploads a small and a large cut-0 packet, alternately,
on the link itself, and keeps each exchange's rest: the round trip less the server's reported
queue + compute. The cost model prices an exchange's rest as
``rtt + other_bytes / rate + body / upload_rate`` (``server.planning.planner.price``, ADR 0006):

- The upload rate: the large body's extra bytes over its extra rest. The large exchange's extra
  wire time at the measured goodput less its extra rest is the ``hidden`` part of a probe (it
  may be negative): an upload's bytes need not cost what a long download's goodput says. When
  the extra rest is not positive (noise at high rates), the body is priced as nearly free:
  :data:`MAX_RATE_FACTOR` times the goodput.
- The overhead (``rtt``): the small exchange's rest less what the model prices its bytes at
  with that upload rate.

So the model reproduces both probed exchanges (their medians) and prices every byte of a body
between and beyond them at the measured slope (ADR 0006 says why this replaced ADR 0004's fitted
overlap).

A device smooths both over its last probes, as TCP smooths its RTT (:data:`PROBE_WINDOW`). It also
learns the overhead from its own traffic, as TCP takes its RTT samples from real segments: the
overhead it prices is the median of its last probe fit and what its last exchanges implied
(:func:`overhead`, :data:`TRAFFIC_WINDOW`), because exchanges between a device's other work cost
more than a probe's back-to-back ones show.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# One probe alone read 3.95 ms where its cell's own exchanges implied 2.13 (5 Mbit/s, a
# transient on this shared machine; `python -m bench.e2e --rate 5 --model fmnist-cnn
# --cell-seconds 5`, console) and flipped the plan to all-device.
PROBE_WINDOW = 3
TRAFFIC_WINDOW = 2  # sittings whose exchanges' implied overhead the next plan request weighs


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


# The fastest an upload body is priced at, as a multiple of the goodput: a body whose extra bytes
# took no measurable time (at 100 Mbit/s the 3,164 B float packet's transfer median was 1.657 ms
# against the 354 B one's 1.660, bench/results/upload-sizes-100.json, in git history) is nearly
# free, but a rate must be finite.
MAX_RATE_FACTOR = 1000.0
MAX_UPLOAD_RATE_BPS = 1e12  # what a plan request accepts (server.schemas.PlanRequest.upload_rate_bps)


def fit_exchange(probes: Sequence[ExchangeProbe], goodput_bps: float,
                 small_transfer_s: Callable[[float], float]) -> tuple[float, float]:
    """(rtt in seconds, upload rate in bit/s) from the medians over ``probes``.

    ``small_transfer_s(upload_rate_bps)`` is what the cost model prices the small exchange's
    transfer at with no round trip and that upload rate. The rate lies in (0, goodput x
    :data:`MAX_RATE_FACTOR`] and under :data:`MAX_UPLOAD_RATE_BPS`; the overhead is never
    negative. Raises ValueError without probes or when the probed bodies are the same size.
    """
    if not probes:
        raise ValueError("no probe to fit")
    hidden = statistics.median(p.hidden_s for p in probes)
    extra = statistics.median(p.extra_wire_s for p in probes)
    if not extra > 0:
        raise ValueError("the probe's two bodies must differ in size")
    shown = max(extra - hidden, extra / MAX_RATE_FACTOR)  # the extra rest the extra bytes took
    upload_rate = min(goodput_bps * extra / shown, MAX_UPLOAD_RATE_BPS)
    rest = statistics.median(p.small_rest_s for p in probes)
    return max(rest - small_transfer_s(upload_rate), 0.0), upload_rate


def overhead(fitted_rtt_s: float, implied: Sequence[float]) -> float:
    """The overhead a device prices: the median of its probe fit and the overheads its recent
    exchanges implied (each their rest less what the cost model prices besides the overhead)."""
    if not all(math.isfinite(v) for v in (fitted_rtt_s, *implied)):
        raise ValueError("overheads must be finite")
    return max(0.0, statistics.median([fitted_rtt_s, *implied]))
