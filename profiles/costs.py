"""The cost model's arithmetic (docs/cost-model.md), shared by the server's planner, which prices
served patterns for a request, and the calibration job, which prices predicted ones over an
envelope of requests to decide which cuts are worth calibrating (``offline.pruning``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qpart.kernels.coding import Coding
from qpart.profiles.devices import DeviceProfile

HTTP_EXCHANGE_BYTES = 768
"""Bytes one small HTTP/1.1 exchange adds on the wire besides its bodies: request and response
headers, and TCP/IPv4 framing of its ~6 packets (66 B each on loopback). Measured with the
shaper's own counters (`tc -s qdisc`) for a tail request of this server from httpx: 1,854 B on
the wire for a 452 B packet and a 634 B answer."""

PRESET_WEIGHTS: dict[str, tuple[float, float, float]] = {
    "latency-first": (1.0, 0.05, 0.01),
    "energy-first": (0.05, 1.0, 0.01),
    "qpart-paper": (1.0, 1.0, 1.0),
}
"""The named objective weights (ω time, τ energy, η server cost) a request may name."""


class Weights(Protocol):
    """Weights of the objective ``J = ω·T + τ·E + η·C``."""

    @property
    def time(self) -> float: ...
    @property
    def energy(self) -> float: ...
    @property
    def cost(self) -> float: ...


@dataclass(frozen=True)
class PresetWeights:
    """A :data:`PRESET_WEIGHTS` entry as :class:`Weights`."""

    time: float
    energy: float
    cost: float


@dataclass(frozen=True)
class PlanInputs:
    """Everything about the request that prices a pattern."""

    device: DeviceProfile
    weights: Weights
    rate_bps: float
    rtt_s: float
    batch: int
    price_per_second: float
    held: frozenset[str]
    upload_overlap_s: float = 0.0
    upload_codings: frozenset[Coding] = frozenset()  # Content-Encodings the device may upload with
    upload_rate_bps: float | None = None  # the activation body's bit/s (None: rate_bps)
    audit_bytes: float = 0.0  # a consenting request's expected audit upload: one input x QPART_AUDIT_RATE


@dataclass(frozen=True)
class Terms:
    """The predicted terms of the objective for one plan."""

    local_s: float
    transfer_s: float
    server_s: float
    local_j: float
    transfer_j: float
    server_cost: float
    objective: float
    sent_bytes: float


def price_terms(inputs: PlanInputs, *, head_flops: int, last: bool, local_s: float, segment_bytes: float,
                activation_bytes: float, answer_bytes: float, header_bytes: int, tail_s: float,
                decode_s: float) -> Terms:
    """Time, energy, server cost and objective of one plan (docs/cost-model.md).

    Per sample: ``local_s`` the device's seconds (head, quantizing, compressing), ``activation_bytes``
    the upload's body, ``answer_bytes`` the answer's, ``tail_s`` and ``decode_s`` the server's
    seconds. ``segment_bytes``: the head segment's download (0: held, or no head); ``last``: the
    all-device cut, which uploads nothing; ``header_bytes``: what the upload's coding adds. Each
    HTTP exchange costs one round trip and :data:`HTTP_EXCHANGE_BYTES`; the upload's time counts
    only past ``inputs.upload_overlap_s`` (ADR 0004), at ``inputs.upload_rate_bps`` (ADR 0006).
    """
    t_local = local_s * inputs.batch
    z_x = 0.0 if last else (activation_bytes + answer_bytes) * inputs.batch
    exchanges = (1 if segment_bytes else 0) + (0 if last else 1)
    sent = segment_bytes + z_x + exchanges * HTTP_EXCHANGE_BYTES + header_bytes
    body = 0.0 if last else activation_bytes * inputs.batch
    upload_rate = inputs.rate_bps if inputs.upload_rate_bps is None else inputs.upload_rate_bps
    t_body = body * 8 / upload_rate
    t_tran = ((sent - body) * 8 / inputs.rate_bps + max(0.0, t_body - inputs.upload_overlap_s)
              + exchanges * inputs.rtt_s)
    t_server = 0.0 if last else (tail_s + decode_s) * inputs.batch
    # An audited plan's device uploads one input after the answers (ADR 0024): bytes and energy, not
    # time to the answer. Expected: that upload times the audit rate, on a plan with a tail.
    audit = 0.0 if last else inputs.audit_bytes
    sent += audit
    e_local = inputs.device.compute_energy_j(t_local, head_flops * inputs.batch)
    e_tran = inputs.device.power_tx_w * (t_tran + audit * 8 / upload_rate)
    cost = inputs.price_per_second * t_server
    w = inputs.weights
    objective = w.time * (t_local + t_tran + t_server) + w.energy * (e_local + e_tran) + w.cost * cost
    return Terms(local_s=t_local, transfer_s=t_tran, server_s=t_server, local_j=e_local, transfer_j=e_tran,
                 server_cost=cost, objective=objective, sent_bytes=sent)
