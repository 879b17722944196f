"""The classification extension's strings and the BYTES tensors that carry them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qpart.server.api.oip_codec import encode_response
from qpart.server.errors import BadRequestError
from qpart.server.oip_schemas import InferOutputTensor, InferRequestedOutput, InferResponse
from qpart.server.tails.classification import class_count, classify


def test_entries_are_score_index_label_by_falling_score_ties_lower_index_first():
    values = np.array([[0.5, 2.0, -1.25, 2.0], [1.0, 0.0, 0.0, 3.0]], dtype=np.float32)
    out = classify(values, 3, ["a", "b", "c", "d"])
    assert out.tolist() == [[b"2.000000:1:b", b"2.000000:3:d", b"0.500000:0:a"],
                            [b"3.000000:3:d", b"1.000000:0:a", b"0.000000:1:b"]]
    assert classify(values, 9, None)[1].tolist() == [b"3.000000:3", b"1.000000:0", b"0.000000:1",
                                                     b"0.000000:2"]


@pytest.mark.parametrize("count", [0, -2, True, 1.5, "3"])
def test_a_classification_count_must_be_a_positive_integer(count):
    with pytest.raises(BadRequestError, match="positive integer"):
        class_count(InferRequestedOutput(name="logits", parameters={"classification": count}))


def test_bytes_outputs_are_utf8_strings_in_json_and_length_prefixed_in_binary():
    arr = np.array([[b"1.0:0:\xc3\xa9t\xc3\xa9", b"0.5:1"]], dtype=object)
    response = InferResponse(model_name="m", outputs=[InferOutputTensor(name="o", shape=[1, 2],
                                                                        datatype="BYTES")])
    text, _ = encode_response(response, {"o": arr}, binary=False)
    assert json.loads(text)["outputs"][0]["data"] == ["1.0:0:été", "0.5:1"]
    raw, headers = encode_response(response, {"o": arr}, binary=True)
    head = int(headers["inference-header-content-length"])
    blob = raw[head:]
    assert blob == b"\x0b\x00\x00\x00" + arr[0, 0] + b"\x05\x00\x00\x00" + arr[0, 1]
    assert json.loads(raw[:head])["outputs"][0]["parameters"] == {"binary_data_size": len(blob)}
