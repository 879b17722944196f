"""The conformance set in the browser (issue 48, acceptance 1): for each architecture family, three
cuts chosen here (the first after 0, a middle one, all on the device) run as the browser device
runs them: the cut's checked ONNX segment in onnxruntime-web (WASM, one thread) in Debian's
chromium, headless, on the page at ``/device/``, its activation quantized and packed by the page's
``packet.js``. On 100 inputs each gives the server's quantized reference's top-1 on at least 99, its
packets are the kernels' bytes for its activation, and its codes equal the torch head's on at least
99.9% of values (as tests/client/test_onnx_device.py requires of the ONNX Runtime device)."""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
import pytest
import torch

from qpart.client.device import encode_for_plan
from qpart.client.plans import PacketFormat
from qpart.kernels import QuantScheme, quantize_pack, unpack_codes
from qpart.kernels.wire import decode_activation
from qpart.models.conformance import FAMILIES, INPUT_SHAPE
from qpart.models.partition import cuts_of, prepare, split
from qpart.server.store.segments import build_onnx_segment
from tests.client.test_browser_device import browser, open_page  # noqa: F401 (the browser fixture)
from tests.client.test_conformance import _pattern, _reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SAMPLES = 100
VERSION = "conformance"
ACTIVATION_BITS = 4
ACTIVATION_GROUP = 256

# In the page: the segment in onnxruntime-web as device.js creates its sessions, the batch run
# through it, the activation packed by packet.js; float32 and packet bytes come back as base64.
RUN_HEAD = """async ({ segment, x, dims, bits, group }) => {
    const ort = await import("/device/vendor/ort.wasm.min.mjs");
    const { encodePacket } = await import("/device/packet.js");
    const bytes = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    const b64 = (u8) => { let s = ""; for (let i = 0; i < u8.length; i += 0x8000)
        s += String.fromCharCode(...u8.subarray(i, i + 0x8000)); return btoa(s); };
    const session = await ort.InferenceSession.create(bytes(segment), {
        executionProviders: ["wasm"], graphOptimizationLevel: "all", intraOpNumThreads: 1,
        interOpNumThreads: 1 });
    const input = new ort.Tensor("float32", new Float32Array(bytes(x).buffer), dims);
    const out = (await session.run({ input })).activation;
    await session.release();
    const packet = bits ? encodePacket(out.data, out.dims, bits, group) : new Uint8Array();
    return { dims: out.dims, activation: b64(new Uint8Array(out.data.buffer)), packet: b64(packet) };
}"""


def _model(family: str) -> torch.nn.Module:
    """The family with test_conformance.py's weights (seed 0, BatchNorm statistics not the identity)."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def _codes(activation: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    packed = quantize_pack(activation, scheme)
    return unpack_codes(packed.data, scheme.bits, packed.numel)


@pytest.fixture(scope="module")
def page(browser, server) -> Any:  # noqa: F811 (the imported fixture)
    opened, errors = open_page(browser, server.url)
    yield opened
    assert errors == []
    opened.close()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_three_cuts_of_each_family_run_in_the_browser_with_the_servers_top1(page, family):
    started = time.perf_counter()
    gm = prepare(_model(family), INPUT_SHAPE)
    cuts = cuts_of(gm)
    chosen = sorted({cuts[1].index, cuts[len(cuts) // 2].index, cuts[-1].index})
    x = torch.randn((SAMPLES, *INPUT_SHAPE), generator=torch.Generator().manual_seed(1))
    x_b64 = base64.b64encode(x.numpy().astype("<f4").tobytes()).decode()
    report = []
    for index in chosen:
        cut = cuts[index]
        head, tail = split(gm, cut)
        pattern = _pattern(head, index)
        last = index == len(cuts) - 1
        with torch.no_grad():  # the torch device's head: the same dequantized weights (test_conformance)
            torch_act = _reference(split(gm, cut)[0], pattern)(x)
            want = tail(torch_act).argmax(1)
        torch_act = torch_act.numpy()
        segment = build_onnx_segment(head, INPUT_SHAPE, family, VERSION, pattern)
        ran = page.evaluate(RUN_HEAD, {
            "segment": base64.b64encode(segment).decode(), "x": x_b64, "dims": [SAMPLES, *INPUT_SHAPE],
            "bits": 0 if last else ACTIVATION_BITS, "group": ACTIVATION_GROUP})
        act = np.frombuffer(base64.b64decode(ran["activation"]), "<f4").reshape(ran["dims"]).copy()
        with torch.no_grad():
            got = tail(torch.from_numpy(act)).argmax(1)
        agree = int((got == want).sum())
        assert agree >= 99, f"{family} cut {index} in the browser: {agree} of {SAMPLES}"
        same = 1.0
        if not last:  # the page's packet is the kernels' for its activation, and its codes the torch head's
            group = min(ACTIVATION_GROUP, act.size)
            packet = base64.b64decode(ran["packet"])
            assert packet == encode_for_plan(act, PacketFormat(activation_bits=ACTIVATION_BITS,
                                                               group_size=group)), (family, index)
            sent = decode_activation(packet)
            scheme = QuantScheme(ACTIVATION_BITS, group)
            browser_codes = unpack_codes(sent.data, ACTIVATION_BITS, sent.numel)
            same = float(np.mean(browser_codes == _codes(torch_act, scheme)))
            assert same >= 0.999, f"{family} cut {index}: codes equal the torch head's on {same:.4%}"
        else:
            assert np.allclose(act, torch_act, rtol=1e-3, atol=1e-4), (family, index)
        report.append(f"cut {index} {agree}/{SAMPLES} codes {same:.2%}")
    print(f"{family}: {len(cuts)} legal cuts; browser: " + ", ".join(report)
          + f" ({time.perf_counter() - started:.1f} s)")
