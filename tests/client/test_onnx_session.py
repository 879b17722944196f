"""The device's ONNX Runtime session for a checked segment: only the checked protobuf is loaded,
and ONNX Runtime's own refusals become one-line SegmentErrors."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qpart.client.errors import SegmentError, SegmentRefusedError
from qpart.client.onnx_runtime import check_segment, create_session
from qpart.client.plans import PlanResponse
from qpart.kernels.errors import UnsafeSegmentError
from qpart.kernels.onnx_segment import (
    ONNX_IR_VERSION,
    ONNX_OPSET,
    ONNX_SEGMENT_FORMAT,
    ONNX_SEGMENT_FORMAT_VERSION,
    check_onnx_segment,
)
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


def test_create_session_does_not_load_the_ort_view_of_a_polyglot(ort_polyglot):
    """With session.load_model_format=ONNX, ONNX Runtime parses the protobuf (an Add of float and
    uint8, which it refuses), never the inner ORT-format model."""
    with pytest.raises(SegmentError, match="ONNX Runtime cannot load the segment") as caught:
        create_session(ort_polyglot, threads=1)
    assert "\n" not in str(caught.value)


def _segment(nodes, initializers) -> bytes:
    graph = helper.make_graph(nodes, "",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("activation", TensorProto.FLOAT, None)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              ir_version=ONNX_IR_VERSION, producer_name=ONNX_SEGMENT_FORMAT,
                              producer_version=ONNX_SEGMENT_FORMAT_VERSION)
    helper.set_model_props(model, METADATA)
    return model.SerializeToString()


def _plan(data: bytes, **overrides) -> PlanResponse:
    fields = {"model": "m", "version": "v", "cut": 1, "plan_id": "m@v/c1-x"} | overrides
    return SimpleNamespace(segment=SimpleNamespace(id=hashlib.sha256(data).hexdigest(),  # type: ignore[return-value]
                                                   size_bytes=len(data)), **fields)


ORT_REFUSES = {
    "an Add of float32 and uint8 (ORT's Fail)": (
        [helper.make_node("Add", ["input", "w"], ["activation"])],
        [numpy_helper.from_array(np.ones(4, np.uint8), "w")]),
    "a Cast to no data type (ORT's Fail or InvalidGraph)": (
        [helper.make_node("Cast", ["input"], ["activation"], to=999)], []),
}


@pytest.mark.parametrize("case", sorted(ORT_REFUSES))
def test_a_segment_the_check_passes_but_ort_refuses_is_a_one_line_segment_error(case):
    data = _segment(*ORT_REFUSES[case])
    check_segment(_plan(data), data)
    with pytest.raises(SegmentError, match=r"^ONNX Runtime cannot load the segment: ") as caught:
        create_session(data, threads=1)
    assert "\n" not in str(caught.value) and not isinstance(caught.value, SegmentRefusedError)


@pytest.mark.parametrize(("field", "value"), [("plan_id", "m@v/c1-y"), ("cut", 2), ("model", "n"),
                                              ("version", "w")])
def test_a_segment_for_another_pattern_cut_model_or_version_is_refused(field, value):
    data = _segment([helper.make_node("Add", ["input", "w"], ["activation"])],
                    [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    assert check_segment(_plan(data), data).metadata == METADATA
    with pytest.raises(SegmentRefusedError, match="it is for"):
        check_segment(_plan(data, **{field: value}), data)
