"""The direct writer of /v2's common answer (one FP32 output) gives encode_response's bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qpart.server.api.oip_codec import encode_fp32_response, encode_response
from qpart.server.oip_schemas import InferOutputTensor, InferResponse

_SPECIAL = np.array([0.0, -0.0, 1e-45, 3.4028235e38, np.nan, np.inf, -np.inf, 0.1, -1.5], np.float32)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("request_id", [None, "", "r-1", 'quote " back \\ slash', "é\u2028\x00"])
@pytest.mark.parametrize("version", [None, "97234b6c2f56"])
@pytest.mark.parametrize("shape", [(1, 10), (32, 10), (0, 10), (3, 3)])
def test_the_direct_writer_gives_the_models_bytes(binary, request_id, version, shape):
    rng = np.random.default_rng(sum(shape))
    values = rng.standard_normal(shape).astype(np.float32) * 1e3
    if values.size >= _SPECIAL.size:
        values.reshape(-1)[: _SPECIAL.size] = _SPECIAL
    model = "fmnist-cnn-tail" if binary else 'a "model"\n'
    output = InferOutputTensor(name="logits", shape=list(values.shape), datatype="FP32")
    response = InferResponse(model_name=model, model_version=version, id=request_id, outputs=[output])
    expected = encode_response(response, {"logits": values}, binary)
    assert encode_fp32_response(model, version, request_id, "logits", values, binary) == expected


def test_a_json_answer_parses_to_the_values():
    values = np.linspace(-3, 3, 20, dtype=np.float32).reshape(2, 10)
    content, headers = encode_fp32_response("m", "v", None, "logits", values, binary=False)
    doc = json.loads(content)
    assert headers == {"content-type": "application/json"} and "id" not in doc
    assert np.array_equal(np.array(doc["outputs"][0]["data"], np.float32).reshape(2, 10), values)
