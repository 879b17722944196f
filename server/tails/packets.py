"""Activation packets on the tail route: decoded with bounds and checked against the plan's cut,
bits and groups before anything runs."""

from __future__ import annotations

import numpy as np

from qpart.kernels import KernelError
from qpart.kernels.wire import decode_activation_array, float_packet_bytes, packet_bytes
from qpart.profiles.artifacts import Pattern
from qpart.server.errors import BadRequestError
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import LoadedModel


def packet_limit(settings: ServerSettings, model: LoadedModel, pattern: Pattern) -> int:
    """The largest activation packet :func:`decode_activation` can take for this pattern (float32
    at the queue's sample limit), within the body limit: what a coded (deflate or zstd) body may
    inflate to."""
    largest = float_packet_bytes((settings.max_queue, *model.cuts[pattern.cut].shape))
    return min(largest, settings.max_body_bytes)


def coded_bytes_bound(packet_size: int) -> int:
    """The most bytes a packet of ``packet_size`` bytes can take coded with deflate or zstd: both
    store incompressible data with under 1/256 of overhead, plus a frame header."""
    return packet_size + packet_size // 256 + 256


def upload_batch(settings: ServerSettings, model: LoadedModel, pattern: Pattern) -> int:
    """The most samples one upload of this pattern's activation may carry: its packet, coded or
    not, within the body limit, and no more than the queue takes (1 at the least, and for a
    pattern whose upload is an image)."""
    if pattern.pattern_id not in model.patterns:  # an input-image plan: one image per request
        return 1
    shape = tuple(model.cuts[pattern.cut].shape)

    def fits(n: int) -> bool:
        size = packet_bytes((n, *shape), pattern.activation_bits, pattern.group_size)
        return coded_bytes_bound(size) <= settings.max_body_bytes

    low, high = 1, settings.max_queue  # packet sizes grow with n: the largest n that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def decode_activation(settings: ServerSettings, model: LoadedModel, pattern: Pattern,
                      packet: bytes) -> np.ndarray:
    """Decode an activation packet and check it matches the pattern's cut, bits and groups.

    Raises:
        BadRequestError: an invalid packet, or one that does not fit the plan (400).
    """
    if pattern.cut == len(model.cuts) - 1:
        raise BadRequestError("this plan is all-device (last cut): there is no tail to run")
    want = tuple(model.cuts[pattern.cut].shape)
    # Bound the decoded size by what the plan can ever need, before anything is allocated.
    limit = settings.max_queue * max(1, model.cuts[pattern.cut].numel)
    try:
        x, bits, group = decode_activation_array(packet, max_elements=limit)
    except KernelError as exc:
        raise BadRequestError(f"invalid activation packet: {exc}") from exc
    if not np.isfinite(x).all():
        raise BadRequestError("the activation dequantizes to values beyond float32 (check scales)")
    if tuple(x.shape[1:]) != want or not 1 <= x.shape[0] <= settings.max_queue:
        dims = ", ".join(map(str, want))
        raise BadRequestError(f"activation shape {list(x.shape)} does not fit cut {pattern.cut}: "
                              f"expected [batch, {dims}] with 1 <= batch <= "
                              f"{settings.max_queue} (QPART_MAX_QUEUE)")
    if bits != pattern.activation_bits or (bits != 32 and group != pattern.group_size):
        raise BadRequestError(f"activation quantized with {bits} bits / group {group}; the plan "
                              f"requires {pattern.activation_bits} bits / group {pattern.group_size}")
    return x
