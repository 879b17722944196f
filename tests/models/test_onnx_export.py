"""ONNX head export of the MobileNetV2-style network (issue 24): ReLU6 as Clip between scalar
initializers, the functional global pool, and graphs large enough that value names run to three
letters; every cut's ONNX head passes the device's check and computes what the torch head loaded
from the same packed weights computes."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from qpart.client.plans import HeadSpec
from qpart.client.runtime import load_head
from qpart.kernels.onnx_segment import check_onnx_segment
from qpart.models.onnx_dequant import GraphParts
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.profiles.artifacts import Pattern
from qpart.server.store.segments import build_onnx_segment, build_segment


def test_value_names_are_unique_and_never_an_initializers_or_a_spelt_out_letter():
    parts = GraphParts()
    names = [parts.value() for _ in range(20_000)]
    assert len(set(names)) == len(names)
    assert all(n.isalpha() and n.islower() for n in names)
    assert not {"q", "r", "t"} & set(names)
    assert names.count("qq") == names.count("rr") == names.count("tt") == 1  # the spelt-out q, r, t


@pytest.fixture(scope="module")
def mobilenet():
    spec = get_model("fmnist-mobilenet")
    torch.manual_seed(0)
    model = spec.build().eval()
    with torch.no_grad():  # random running statistics, so that the folded convolutions are not trivial
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    return spec, prepare(model, spec.input_shape)


def test_every_cut_of_the_mobilenet_exports_checks_and_matches_the_torch_head(mobilenet):
    spec, gm = mobilenet
    cuts = cuts_of(gm)
    x = np.random.default_rng(0).standard_normal((4, *spec.input_shape)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    ops: set[str] = set()
    for cut in cuts[1:]:
        head, _ = split(gm, cut)
        bits = {n: 3 + i % 5 for i, (n, p) in enumerate(head.named_parameters()) if p.dim() > 1}
        pattern = cast(Pattern, SimpleNamespace(cut=cut.index, pattern_id="p", weight_bits=bits))
        onnx_bytes = build_onnx_segment(head, spec.input_shape, spec.name, "1", pattern)
        check_onnx_segment(onnx_bytes, hashlib.sha256(onnx_bytes).hexdigest())
        ops |= {n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node}
        session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"input": x})[0]
        # the torch device's head: the registered code, every tensor loaded from the packed segment
        head_spec = HeadSpec(model=spec.name, version="1", cut=cut.index, cut_node=cut.node, cuts=len(cuts))
        torch_head = load_head(head_spec, build_segment(head, spec.name, "1", pattern))
        with torch.inference_mode():
            want = torch_head(torch.from_numpy(x)).numpy()
        assert got.shape == want.shape == (4, *cut.shape)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())), cut.index
    assert {"Clip", "GlobalAveragePool", "Conv", "Add", "Gemm"} <= ops
