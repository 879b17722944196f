"""Open Inference Protocol bodies: JSON tensors and the binary tensor data extension.

A binary request is a JSON header of ``Inference-Header-Content-Length`` bytes followed by raw
little-endian tensor blobs, consumed in input order by each input's ``binary_data_size``.
Every size is checked before any array is built from the bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from qpart.server.errors import BadRequestError
from qpart.server.oip_schemas import InferInputTensor, InferOutputTensor, InferRequest, InferResponse

_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
HEADER = "inference-header-content-length"


@dataclass(frozen=True)
class DecodedRequest:
    """A parsed v2 request: its JSON part and one array (or raw bytes) per input name."""

    request: InferRequest
    arrays: dict[str, np.ndarray]
    binary_output: bool


def _numel(tensor: InferInputTensor, max_elements: int) -> int:
    n = 1
    for d in tensor.shape:
        # A zero empties the tensor, but the other dimensions must still fit: numpy refuses to
        # shape even an empty array as [0, 14417, 689960, 231809337] (a ValueError, a 500 before).
        n *= max(d, 1)
        if n > max_elements:
            raise BadRequestError(f"input '{tensor.name}' shape {tensor.shape} is too large")
    return 0 if 0 in tensor.shape else n


def _from_json(tensor: InferInputTensor, max_elements: int) -> np.ndarray:
    n = _numel(tensor, max_elements)
    if tensor.datatype not in _DTYPES:
        raise BadRequestError(f"input '{tensor.name}': datatype {tensor.datatype} is not supported")
    try:
        arr = np.asarray(tensor.data, dtype=_DTYPES[tensor.datatype]).reshape(-1)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequestError(f"input '{tensor.name}': data is not a flat list of "
                              f"{tensor.datatype} values: {exc}") from exc
    if arr.size != n:
        raise BadRequestError(f"input '{tensor.name}': {arr.size} values for shape {tensor.shape}")
    return arr.reshape(tensor.shape)


def _from_binary(tensor: InferInputTensor, size: object, blobs: memoryview, offset: int,
                 max_elements: int) -> np.ndarray:
    if tensor.datatype not in _DTYPES or isinstance(size, bool) or not isinstance(size, int):
        raise BadRequestError(f"input '{tensor.name}': binary_data_size must be an integer and "
                              f"the datatype fixed-size, got {size!r} / {tensor.datatype}")
    n = _numel(tensor, max_elements)
    dtype = _DTYPES[tensor.datatype]
    if size != n * dtype.itemsize or offset + size > len(blobs):
        raise BadRequestError(f"input '{tensor.name}': binary_data_size {size} does not match shape "
                              f"{tensor.shape} of {tensor.datatype} or the body's remaining "
                              f"{len(blobs) - offset} bytes")
    return np.frombuffer(blobs[offset : offset + size], dtype=dtype).reshape(tensor.shape)


def _header_split(header_length: str, body_bytes: int) -> int:
    """Where the JSON header ends, from the ``Inference-Header-Content-Length`` value."""
    digits = header_length.lstrip("0") or "0"
    # Lengths are compared before int(), which refuses strings of more than 4300 digits with a
    # ValueError (CVE-2020-10735): a header of 5000 nines was a 500.
    if (not (header_length.isascii() and header_length.isdigit()) or len(digits) > len(str(body_bytes))
            or int(digits) > body_bytes):
        raise BadRequestError(f"Inference-Header-Content-Length {header_length[:32]!r} does not fit a "
                              f"body of {body_bytes} bytes")
    return int(digits)


def decode_request(body: bytes, header_length: str | None, *, max_elements: int) -> DecodedRequest:
    """Parse a v2 infer body (JSON, or JSON + binary blobs)."""
    split = len(body) if header_length is None else _header_split(header_length, len(body))
    try:
        request = InferRequest.model_validate_json(body[:split])
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise BadRequestError(f"invalid inference request: {loc or 'body'}: {first.get('msg')}") from exc
    blobs = memoryview(body)[split:]
    offset = 0
    arrays: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is None:
            if tensor.data is None:
                raise BadRequestError(f"input '{tensor.name}' has neither data nor binary_data_size")
            arrays[tensor.name] = _from_json(tensor, max_elements)
            continue
        arrays[tensor.name] = _from_binary(tensor, size, blobs, offset, max_elements)
        offset += int(size)
    if offset != len(blobs):
        raise BadRequestError(f"{len(blobs) - offset} bytes of binary data are not claimed by any input")
    if len(arrays) != len(request.inputs):
        raise BadRequestError("duplicate input names")
    return DecodedRequest(request, arrays, _wants_binary(request))


def _wants_binary(request: InferRequest) -> bool:
    if (request.parameters or {}).get("binary_data_output") is True:
        return True
    return any((o.parameters or {}).get("binary_data") is True for o in request.outputs or [])


def _bytes_blob(arr: np.ndarray) -> bytes:
    """A BYTES tensor (an object array of ``bytes``) in the binary extension's layout: each
    element, in row-major order, as a 4-byte little-endian length and its bytes."""
    return b"".join(len(b).to_bytes(4, "little") + b for b in arr.reshape(-1).tolist())


def encode_response(response: InferResponse, arrays: dict[str, np.ndarray],
                    binary: bool) -> tuple[bytes, dict[str, str]]:
    """Serialize a v2 response; with ``binary`` the tensors follow the JSON header as raw bytes.
    A BYTES output's array holds ``bytes`` (UTF-8 text in the JSON form)."""
    blobs = []
    outputs = []
    for out in response.outputs:
        arr = arrays[out.name]
        if binary:
            raw = _bytes_blob(arr) if out.datatype == "BYTES" else \
                np.ascontiguousarray(arr, dtype=_DTYPES[out.datatype]).tobytes()
            blobs.append(raw)
            outputs.append(InferOutputTensor(name=out.name, shape=out.shape, datatype=out.datatype,
                                             parameters={"binary_data_size": len(raw)}))
        else:
            flat = arr.reshape(-1).tolist()
            data = [b.decode() for b in flat] if out.datatype == "BYTES" else flat
            outputs.append(InferOutputTensor(name=out.name, shape=out.shape, datatype=out.datatype,
                                             data=data))
    doc = response.model_copy(update={"outputs": outputs}).model_dump(exclude_none=True)
    head = json.dumps(doc).encode()
    if not binary:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream",
                                    "inference-header-content-length": str(len(head))}


def encode_fp32_response(model_name: str, model_version: str | None, request_id: str | None, output: str,
                         values: np.ndarray, binary: bool) -> tuple[bytes, dict[str, str]]:
    """:func:`encode_response`'s bytes for a response of one FP32 output and no parameters, the
    common case of /v2 infer, written directly: no response models built, copied and dumped per
    request (issue 54). ``tests/server/api/test_oip_codec.py`` holds the two to the same bytes."""
    parts = ['{"model_name": ', json.dumps(model_name)]
    if model_version is not None:
        parts += [', "model_version": ', json.dumps(model_version)]
    if request_id is not None:
        parts += [', "id": ', json.dumps(request_id)]
    parts += [', "outputs": [{"name": ', json.dumps(output), ', "shape": ', json.dumps(list(values.shape)),
              ', "datatype": "FP32"']
    if not binary:
        parts += [', "data": ', json.dumps(values.reshape(-1).tolist()), "}]}"]
        return "".join(parts).encode(), {"content-type": "application/json"}
    raw = np.ascontiguousarray(values, dtype=_DTYPES["FP32"]).tobytes()
    parts += [', "parameters": {"binary_data_size": ', str(len(raw)), "}}]}"]
    head = "".join(parts).encode()
    return head + raw, {"content-type": "application/octet-stream",
                        "inference-header-content-length": str(len(head))}
