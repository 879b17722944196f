"""A bounded reader of the protobuf wire format: just enough to walk an ONNX model's fields.

Protobuf encodes a message as a sequence of ``(tag, value)`` records, ``tag = field << 3 | wire``
(a varint), the value a varint (wire 0), 8 bytes (wire 1), a varint length and that many bytes
(wire 2: strings, bytes, nested messages, packed arrays) or 4 bytes (wire 5). Groups (wire 3, 4)
are deprecated and refused. Every length is checked against the bytes that remain; a tag is at most
5 bytes and below 2**32 (protobuf parsers truncate a wider one to 32 bits: the check would read
another field than ONNX Runtime does), its field number in 1..2**29-1; other varints are at most 10
bytes and below 2**64. :func:`text` and :func:`message` take only wire type LENGTH. The reader
never copies: values are ``memoryview`` slices of the input.
"""

from __future__ import annotations

from collections.abc import Iterator

from qpart.kernels.errors import TruncatedError, WireFormatError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_FIXED = {FIXED64: 8, FIXED32: 4}


MAX_FIELD_NUMBER = (1 << 29) - 1


def read_varint(data: memoryview, pos: int, *, max_bytes: int = 10, bits: int = 64) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it: at most ``max_bytes`` bytes and below
    ``2**bits`` (protobuf parsers truncate wider values, so the check would read another number)."""
    value = 0
    for i in range(max_bytes):
        if pos + i >= len(data):
            raise TruncatedError("protobuf ends inside a varint")
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >> bits:
                raise WireFormatError(f"protobuf varint does not fit in {bits} bits")
            return value, pos + i + 1
    raise WireFormatError(f"protobuf varint longer than {max_bytes} bytes")


def read_tag(data: memoryview, pos: int) -> tuple[int, int, int]:
    """``(field number, wire type, position after)`` of the tag at ``pos``: at most 5 bytes, below
    ``2**32``, a field number in 1..2**29-1."""
    tag, pos = read_varint(data, pos, max_bytes=5, bits=32)
    number, wire = tag >> 3, tag & 7
    if not 1 <= number <= MAX_FIELD_NUMBER:
        raise WireFormatError(f"protobuf field number {number}")
    return number, wire, pos


def fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` of each record of one message, in order: the value is
    an int for varints and a view of the bytes otherwise."""
    pos = 0
    while pos < len(data):
        number, wire, pos = read_tag(data, pos)
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


# A packed varint array as one byte per byte: 1 for a continuation byte (0x80 and up), 2 for a last
# byte with bits above bit 0 (0x02..0x7f), 0 for 0x00 and 0x01. Inside it, b"\1" * 10 is a varint of
# more than 10 bytes and b"\1" * 9 + b"\2" a 10-byte one above 2**64 (bytes.find: no Python loop).
_VARINT_CLASSES = bytes(0 if b < 2 else 2 if b < 0x80 else 1 for b in range(256))
_TOO_LONG, _TOO_WIDE = b"\1" * 10, b"\1" * 9 + b"\2"


def check_packed(value: memoryview, wire: int, what: str) -> int:
    """Refuse a packed repeated field (``value``, wire type LENGTH) whose elements of wire type
    ``wire`` do not fill it exactly (the rules of :func:`read_varint` for each varint); return how
    many elements it holds. Checked with bytes operations (no Python loop per element)."""
    if wire in _FIXED:
        if len(value) % _FIXED[wire]:
            raise WireFormatError(f"{what} is a packed array of {len(value)} bytes, not a multiple of "
                                  f"{_FIXED[wire]}")
        return len(value) // _FIXED[wire]
    classes = bytes(value).translate(_VARINT_CLASSES)
    if classes and classes[-1] == 1:
        raise TruncatedError(f"{what}: protobuf ends inside a varint")
    if _TOO_LONG in classes or _TOO_WIDE in classes:
        raise WireFormatError(f"{what}: protobuf varint longer than 10 bytes or above 2**64")
    return len(classes) - classes.count(1)  # the bytes that end a varint


def text(wire: int, value: int | memoryview, what: str) -> str:
    """A length-delimited field (wire type LENGTH only) as UTF-8 text."""
    if wire != LENGTH or isinstance(value, int):
        raise WireFormatError(f"{what} has wire type {wire} where text was expected")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"{what} is not UTF-8") from exc


def message(wire: int, value: int | memoryview, what: str) -> memoryview:
    """A length-delimited field (wire type LENGTH only) as a nested message's bytes."""
    if wire != LENGTH or isinstance(value, int):
        raise WireFormatError(f"{what} has wire type {wire} where a message was expected")
    return value
