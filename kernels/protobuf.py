"""A bounded reader of the protobuf wire format: just enough to walk an ONNX model's fields.

Protobuf encodes a message as a sequence of ``(tag, value)`` records, ``tag = field << 3 | wire``
(a varint), the value a varint (wire 0), 8 bytes (wire 1), a varint length and that many bytes
(wire 2: strings, bytes, nested messages, packed arrays) or 4 bytes (wire 5). Groups (wire 3, 4)
are deprecated and refused. Every length is checked against the bytes that remain, varints are at
most 10 bytes, and the reader never copies: values are ``memoryview`` slices of the input.
"""

from __future__ import annotations

from collections.abc import Iterator

from qpart.kernels.errors import TruncatedError, WireFormatError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_FIXED = {FIXED64: 8, FIXED32: 4}


def read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = 0
    for i in range(10):
        if pos + i >= len(data):
            raise TruncatedError("protobuf ends inside a varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    raise WireFormatError("protobuf varint longer than 10 bytes")


def fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` of each record of one message, in order: the value is
    an int for varints and a view of the bytes otherwise."""
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireFormatError("protobuf field number 0")
        if wire == VARINT:
            value, pos = read_varint(data, pos)
            yield number, wire, value
        elif wire == LENGTH:
            size, pos = read_varint(data, pos)
            if size > len(data) - pos:
                raise TruncatedError(f"protobuf field {number} claims {size} bytes; {len(data) - pos} remain")
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire in _FIXED:
            size = _FIXED[wire]
            if size > len(data) - pos:
                raise TruncatedError(f"protobuf ends inside fixed-size field {number}")
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise WireFormatError(f"protobuf wire type {wire} (field {number}) is not supported")


def text(value: int | memoryview, what: str) -> str:
    """A length-delimited field as UTF-8 text."""
    if isinstance(value, int):
        raise WireFormatError(f"{what} is a number where text was expected")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"{what} is not UTF-8") from exc


def message(value: int | memoryview, what: str) -> memoryview:
    """A length-delimited field as a nested message's bytes."""
    if isinstance(value, int):
        raise WireFormatError(f"{what} is a number where a message was expected")
    return value
