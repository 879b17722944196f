"""The device without PyTorch: ``qpart device infer --runtime onnx`` and OnnxDeviceRuntime in a
process where ``import torch`` fails, against a live server; and the ONNX head against the torch
head, code for code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from qpart.client.errors import SegmentRefusedError
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.kernels.onnx_segment import OnnxSegmentLimits

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
NOTORCH = Path(__file__).parent / "notorch"
REPO = Path(__file__).resolve().parents[2]
FAST = {"schema_version": 2, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}


def _without_torch(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NOTORCH), str(REPO)])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env,
                          cwd=cwd, check=False)


def test_torch_really_fails_to_import_in_the_shim(tmp_path):
    done = _without_torch(["-c", "import torch"], tmp_path)
    assert done.returncode != 0 and "not installed on this device" in done.stderr


def test_the_cli_runs_onnx_heads_without_torch(server, tmp_path):
    profile = tmp_path / "fast.json"
    profile.write_text(json.dumps(FAST))
    args = ["-m", "qpart", "device", "infer", "--runtime", "onnx", "--idx", IMAGES, "--labels", LABELS,
            "--limit", "200", "--device-profile", str(profile), "--rate-mbps", "10000",
            "--server", server.url, "--cache-dir", str(tmp_path / "cache"), "--json"]
    done = _without_torch(args, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["plan"]["segment"]["runtime"] == "onnx" and doc["downloaded_bytes"] > 0
    assert doc["accuracy"] > 0.85


def test_the_python_api_imports_no_torch_and_no_model_code(server, tmp_path):
    script = f"""
import sys, json
from pathlib import Path
from qpart.client.inputs import read_idx_images
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.profiles.devices import DeviceProfile
x = read_idx_images(Path({IMAGES!r}), limit=64)
runtime = OnnxDeviceRuntime(DeviceSettings(server={server.url!r}, cache_dir=Path({str(tmp_path / "c")!r})),
                            device_profile=DeviceProfile.model_validate({FAST!r}))
try:
    run = runtime.infer(x, "fmnist-cnn", 0.01, rate_bps=1e10)
finally:
    runtime.close()
code = ("qpart.models.partition", "qpart.models.registry", "qpart.models.architectures")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "safetensors") or m.startswith(code))
print(json.dumps({{"n": len(run.predictions), "cut": run.plan.cut, "heavy": heavy}}))
"""
    done = _without_torch(["-c", script], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout.splitlines()[-1])
    assert doc["n"] == 64 and doc["cut"] > 0 and doc["heavy"] == []


def test_a_refused_segment_is_never_cached(server, tmp_path):
    settings = DeviceSettings(server=server.url, cache_dir=tmp_path / "cache")
    profile_runtime = OnnxDeviceRuntime(settings, limits=OnnxSegmentLimits(max_nodes=2))
    from qpart.profiles.devices import DeviceProfile

    profile_runtime.device_profile = DeviceProfile.model_validate(FAST)
    try:
        plan = profile_runtime.plan("fmnist-cnn", 0.01, rate_bps=1e10)
        assert plan.segment is not None
        with pytest.raises(SegmentRefusedError, match="more than 2 nodes"):
            profile_runtime.fetch_segment(plan)
    finally:
        profile_runtime.close()
    assert not list((tmp_path / "cache").glob("*.seg")) and not list((tmp_path / "cache").glob("*.part"))


@pytest.mark.parametrize("which", ["every-cut", "committed"])
def test_onnx_head_codes_equal_the_torch_heads_at_every_cut(every_cut, cnn_only, which):
    """Acceptance 2: at every cut of fmnist-cnn at the 1% level, the ONNX head's activation codes
    equal the torch head's on at least 99.9% of values, on 500 test images: every legal cut (the
    every-cut artifact) and every cut the committed artifact calibrated."""
    import onnxruntime as ort
    import torch

    from qpart.client.plans import HeadSpec
    from qpart.client.runtime import load_head
    from qpart.kernels import QuantScheme, quantize_pack, unpack_codes
    from qpart.models.data import Split, load_split
    from qpart.server.store.catalog import Catalog
    from qpart.server.store.segments import build_onnx_segment, build_segment

    root = every_cut if which == "every-cut" else cnn_only
    model = next(e.model for e in Catalog.load(root).entries if e.name == "fmnist-cnn")
    x = load_split(Split.TEST, limit=500).images
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    checked = 0
    for pattern in (p for p in model.artifact.patterns if p.level == 0.01 and p.cut > 0):
        head = model.parts[pattern.cut][0]
        spec = HeadSpec(model=model.name, version=model.version, cut=pattern.cut,
                        cut_node=model.cuts[pattern.cut].node, cuts=len(model.cuts))
        torch_head = load_head(spec, build_segment(head, model.name, model.version, pattern))
        with torch.inference_mode():
            want = torch_head(torch.from_numpy(x)).numpy()
        onnx_bytes = build_onnx_segment(head, (1, 28, 28), model.name, model.version, pattern)
        session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"input": x})[0]
        if pattern.activation_bits >= 32:
            assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            scheme = QuantScheme(pattern.activation_bits, pattern.group_size)
            codes = [unpack_codes((p := quantize_pack(a, scheme)).data, scheme.bits, p.numel)
                     for a in (got, want)]
            assert np.mean(codes[0] == codes[1]) >= 0.999, pattern.pattern_id
        checked += 1
    assert checked == len(model.artifact.calibrated_cuts) - 1  # every calibrated cut but cut 0
    assert which == "committed" or checked == len(model.cuts) - 1


def test_the_server_is_asked_for_onnx(server):
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e10, "device": FAST,
            "runtime": "onnx"}
    plan = httpx.post(f"{server.url}/v1/plan", json=body).json()
    assert plan["segment"]["runtime"] == "onnx"
