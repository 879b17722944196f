"""What a device uploads: the activation packet as the plan says (quantized, maybe compressed), and an
audited plan's one raw input after the answers (ADR 0024)."""

from __future__ import annotations

import numpy as np

from qpart.client.errors import DeviceError
from qpart.client.plans import AuditReceipt, PacketFormat, PlanResponse, parse_answer
from qpart.client.transport import Transport
from qpart.kernels.coding import Coding, encode
from qpart.kernels.wire import encode_float_activation, encode_quantized_activation

FLOAT_BITS = 32


def encode_for_plan(activation: np.ndarray, plan: PacketFormat) -> bytes:
    """Quantize the activation with the plan's bits and group size (kernels) and pack it."""
    if plan.activation_bits >= FLOAT_BITS:
        return encode_float_activation(activation)
    return encode_quantized_activation(activation, plan.activation_bits, plan.group_size)


def upload_body(plan: PacketFormat, packet: bytes) -> tuple[bytes, dict[str, str]]:
    """The body and headers that upload ``packet`` as the plan says: compressed (kernels.coding)
    when its ``upload_encoding`` is ``deflate`` or ``zstd``, else as is."""
    headers = {"Content-Type": "application/octet-stream"}
    coding = plan.upload_encoding
    if isinstance(coding, Coding):
        return encode(packet, coding), {**headers, "Content-Encoding": coding.value}
    return packet, headers


def audit_sample(batch: np.ndarray, header: str | None) -> np.ndarray | None:
    """The one sample (``[1, ...]``) of ``batch`` that the tail answer's ``Qpart-Audit-Sample`` names
    (None: it names none, or one outside the batch: nothing is uploaded)."""
    if header is None or not header.isascii() or not header.isdigit() or len(header) > 6:
        return None
    index = int(header)
    return batch[index : index + 1] if index < len(batch) else None


def upload_audit(transport: Transport, plan: PlanResponse, inputs: np.ndarray) -> str:
    """Upload an audited plan's raw input (the audited sample, a float32 packet) to its audit URL;
    what came of it:
    queued, dropped (the server was busy) or failed: <why>. A failed audit upload is reported,
    never raised: the answers stand."""
    assert plan.audit is not None
    try:
        response = transport.request("POST", plan.audit.url, content=encode_float_activation(inputs),
                                     headers={"Content-Type": "application/octet-stream"})
        receipt = parse_answer(AuditReceipt, response.content)
    except DeviceError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return f"failed: {first}"
    return "queued" if receipt.queued else "dropped"
