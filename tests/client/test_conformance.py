"""The conformance set (issue 48, ADR 0019): each architecture family users bring, registered
through the public path, every cut checked for every runtime (models.runtimes), then every cut
offered to a runtime run on that device's own path: the torch device builds the head from the model
code and loads the safetensors segment; the ONNX Runtime device checks the ONNX segment and runs it.
Each must give the same top-1 as the server's quantized reference (the head with the pattern's
dequantized weights, then the float tail) on at least 99 of 100 inputs, and the same activation at
the cut to 1e-4 of its largest value (top-1 alone cannot fail where random weights give one class)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from qpart.client.onnx_runtime import check_segment, create_session
from qpart.client.plans import HeadSpec
from qpart.client.runtime import load_head
from qpart.client.settings import DeviceSettings
from qpart.kernels import unpack_dequantize
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, HeadRuntime
from qpart.models.conformance import FAMILIES, INPUT_SHAPE
from qpart.models.partition import cut_flops, cuts_of, prepare, split
from qpart.models.registry import REGISTRY_ENV, register_model
from qpart.models.runtimes import runtime_refusals
from qpart.profiles.artifacts import Pattern
from qpart.server.store.segments import build_onnx_segment, build_segment, quantize_head

SAMPLES = 100
VERSION = "conformance"


def _pattern(head: torch.fx.GraphModule, cut: int) -> Pattern:
    """Every weight of the head at 4 bits (biases, norms and buffers float)."""
    bits = {name: 4 for name, p in head.named_parameters() if p.dim() >= 2}
    return Pattern.model_construct(pattern_id=f"c{cut}-w4", cut=cut, weight_bits=bits)


def _reference(head: torch.fx.GraphModule, pattern: Pattern) -> torch.fx.GraphModule:
    """The server's quantized reference of the head: its weights as the pattern dequantizes them."""
    quantized, _ = quantize_head(head, pattern)
    params = dict(head.named_parameters())
    with torch.no_grad():
        for name, packed in quantized.items():
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(unpack_dequantize(packed))))
    return head


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """Registers a family as a user would (factory path, safetensors weights, registry file)."""
    registry = tmp_path / "models.json"
    monkeypatch.setenv(REGISTRY_ENV, str(registry))

    def register(family: str) -> torch.nn.Module:
        torch.manual_seed(0)
        model = FAMILIES[family]().eval()
        with torch.no_grad():  # BatchNorm statistics that are not the identity
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        weights = tmp_path / f"{family}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
        factory = f"qpart.models.conformance:{FAMILIES[family].__name__}"
        return register_model(family, factory, weights, INPUT_SHAPE, registry).load()

    return register


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_cut_offered_to_a_runtime_runs_on_that_device_with_the_servers_top1(registered, family):
    model = registered(family)
    gm = prepare(model, INPUT_SHAPE)
    cuts = cuts_of(gm)
    flops = cut_flops(gm)  # the card's head FLOPs of a cut: those of its ops up to it (offline.runner)
    x = torch.randn((SAMPLES, *INPUT_SHAPE), generator=torch.Generator().manual_seed(1))
    offered = {runtime: [0] for runtime in HeadRuntime}
    for cut in cuts[1:]:
        head, tail = split(gm, cut)
        refused = runtime_refusals(head, INPUT_SHAPE)
        pattern = _pattern(head, cut.index)
        spec = HeadSpec(model=family, version=VERSION, cut=cut.index, cut_node=cut.node, cuts=len(cuts))
        with torch.no_grad():
            reference = _reference(split(gm, cut)[0], pattern)(x)
            want = tail(reference).argmax(1)
        runs = {}
        if HeadRuntime.TORCH.value not in refused:
            device_head = load_head(spec, build_segment(head, family, VERSION, pattern))
            runs[HeadRuntime.TORCH] = lambda h=device_head: h(x)
        if HeadRuntime.ONNX.value not in refused:
            data = build_onnx_segment(head, INPUT_SHAPE, family, VERSION, pattern)
            plan = _onnx_plan(spec, data, sum(flops[: cut.position + 1]))
            check_segment(plan, data, settings=DeviceSettings())  # within the work budget it declares
            session = create_session(data, threads=1)
            runs[HeadRuntime.ONNX] = lambda s=session: torch.from_numpy(
                s.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0])
        for runtime, run in runs.items():
            with torch.no_grad():
                activation = run()
                got = tail(activation).argmax(1)
            agree = int((got == want).sum())
            assert agree >= 99, f"{family} cut {cut.index} on {runtime.value}: {agree} of {SAMPLES}"
            # With random weights most families answer one class for most inputs, so top-1 alone
            # would pass a head that computes nothing: the activation itself must be the reference's.
            error = float((activation - reference).abs().max() / reference.abs().max().clamp_min(1e-12))
            assert error <= 1e-4, f"{family} cut {cut.index} on {runtime.value}: activation off {error:.2e}"
            offered[runtime].append(cut.index)
    legal = len(cuts)
    print(f"{family}: {legal} legal cuts; offered: "
          + ", ".join(f"{r.value} {len(c)}" for r, c in offered.items()))
    assert len(offered[HeadRuntime.TORCH]) == legal
    assert len(offered[HeadRuntime.ONNX]) >= 0.95 * legal


def _onnx_plan(spec: HeadSpec, data: bytes, head_flops: int):
    from qpart.client.plans import PlanResponse
    from tests.client.samples import PLAN

    digest = hashlib.sha256(data).hexdigest()
    segment = {"id": digest, "url": f"/v1/segments/{digest}", "size_bytes": len(data), "sha256": digest,
               "held": False, "runtime": "onnx"}
    doc = {**PLAN, "plan_id": f"{spec.model}@{spec.version}/c{spec.cut}-w4", "segment": segment,
           "head_flops": head_flops, **spec.model_dump()}
    return PlanResponse.model_validate(doc)
