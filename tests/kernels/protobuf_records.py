"""Raw protobuf records for the ONNX segment tests: bytes that protobuf's own writer never emits."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """``n`` as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if not n:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def record(number: int, payload: bytes, tag: int | None = None) -> bytes:
    """A length-delimited record of field ``number`` (or with the raw ``tag`` given)."""
    return varint(number << 3 | 2 if tag is None else tag) + varint(len(payload)) + payload
