"""The device's ONNX Runtime session for a checked segment: only the checked protobuf is loaded,
and ONNX Runtime's own refusals become one-line SegmentErrors."""

from __future__ import annotations

import hashlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from qpart.kernels.errors import UnsafeSegmentError
from qpart.kernels.onnx_segment import check_onnx_segment
from tests.client.ort_polyglot import ort_format_model, polyglot

METADATA = {"model": "m", "version": "v", "cut": "1", "pattern_id": "c1-x"}


@pytest.fixture(scope="module")
def ort_polyglot(tmp_path_factory) -> bytes:
    inner = ort_format_model(tmp_path_factory.mktemp("ort") / "inner.ort",
                             [helper.make_node("Sin", ["input"], ["activation"])])  # not allowed
    return polyglot(inner, METADATA)


def test_the_polyglot_is_an_ort_format_model_to_a_default_session(ort_polyglot):
    """The reviewer's bypass, rebuilt: without the format option ONNX Runtime runs the inner Sin."""
    session = ort.InferenceSession(ort_polyglot, providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(session.run(None, {"input": x})[0], np.sin(x), atol=1e-6)


def test_the_check_refuses_an_ort_format_polyglot(ort_polyglot):
    with pytest.raises(UnsafeSegmentError, match="ORT-format marker"):
        check_onnx_segment(ort_polyglot, hashlib.sha256(ort_polyglot).hexdigest())
