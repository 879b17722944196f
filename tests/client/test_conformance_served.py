"""The conformance set served (issue 48, acceptance 1): each architecture family is registered with
``qpart models register``, calibrated with ``qpart calibrate`` on a small sample configuration
(random arrays in an .npz, one level, 100 fit and 100 check samples), and one live ``qpart serve``
serves all eight over a real socket. For every pattern the server lists for a runtime, that
runtime's device (torch: :class:`DeviceRuntime`; ONNX Runtime: :class:`OnnxDeviceRuntime`) downloads
the pattern's segment, runs the head and uploads the activation over HTTP; every request answers,
the two devices give the same classes and logits within 1% (random weights answer one class for
most inputs in most families, so classes alone would pass a head that computes nothing), and the
server logs no 500 and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from qpart.client.device import DeviceClient, encode_for_plan
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.plans import PlanResponse
from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.models.conformance import FAMILIES, INPUT_SHAPE
from qpart.models.registry import REGISTRY_ENV
from tests.client.samples import COSTS
from tests.client.test_conformance_browser import _model
from tests.conftest import LiveServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
INPUTS = 4
CALIBRATION = ("--levels", "0.05", "--fit-samples", "100", "--check-samples", "100", "--noise-samples", "50",
               "--mapping-points", "4", "--threads", "1", "--workers", "1", "--no-baseline")
CALIBRATION_ENV = {"QPART_CALIB_MEASURE_BOTH": "false", "QPART_CALIB_BATCH_SIZE": "100"}


def _arrays(path: Path, n: int, seed: int) -> None:
    """``n`` random inputs with random labels: enough to calibrate a random-weight net."""
    x = torch.randn((n, *INPUT_SHAPE), generator=torch.Generator().manual_seed(seed)).numpy()
    y = np.random.default_rng(seed).integers(0, 10, n)
    np.savez(path, x=x, y=y)


def _qpart(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "qpart", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"qpart {args[0]}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, Any]]]:
    """All eight families registered and calibrated through the CLI, then one ``qpart serve``."""
    root = tmp_path_factory.mktemp("conformance")
    registry, artifacts = root / "models.json", root / "artifacts"
    # One thread a process: on a loaded two-core machine torch's default two spin against each other
    # (the runtime checks of mobilenet-v2's 34 cuts took 27 s with two, 4 s with one).
    env = {**os.environ, REGISTRY_ENV: str(registry), "OMP_NUM_THREADS": "1", **CALIBRATION_ENV}
    _arrays(root / "calibration.npz", 200, 1)
    _arrays(root / "test.npz", 100, 2)
    started = time.perf_counter()
    for family in FAMILIES:  # registered one after the other: each rewrites the registry file
        weights = root / f"{family}.safetensors"
        save_file({k: v.contiguous() for k, v in _model(family).state_dict().items()}, str(weights))
        _qpart(env, "models", "register", "--name", family, "--factory",
               f"qpart.models.conformance:{FAMILIES[family].__name__}", "--weights", str(weights),
               "--input-shape", ",".join(map(str, INPUT_SHAPE)), "--registry", str(registry))

    def calibrate(family: str) -> str:
        return _qpart(env, "calibrate", "--model", family, "--out", str(artifacts / family), "--data",
                      str(root / "calibration.npz"), "--test-data", str(root / "test.npz"), *CALIBRATION)

    with ThreadPoolExecutor(2) as pool:  # two one-thread jobs at a time: the two cores
        list(pool.map(calibrate, FAMILIES))
    print(f"\nregistered and calibrated {len(FAMILIES)} families in {time.perf_counter() - started:.0f} s")
    live = LiveServer(artifacts, {REGISTRY_ENV: str(registry), "OMP_NUM_THREADS": "1"})
    before = os.environ.get(REGISTRY_ENV)
    os.environ[REGISTRY_ENV] = str(registry)  # the torch device builds heads from the registered factory
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        live.wait_ready(timeout=180)
        yield live, {"root": root}
    finally:
        torch.set_num_threads(threads)
        if before is None:
            os.environ.pop(REGISTRY_ENV, None)
        else:
            os.environ[REGISTRY_ENV] = before
        log = live.stop()
        bad = [line for line in log.splitlines() if " 500" in line or "Traceback" in line]
        assert bad == [], "\n".join(bad[:20])


def _plans(device: DeviceClient, family: str, runtime: str,
           shapes: dict[int, list[int]]) -> list[PlanResponse]:
    """Every pattern the server lists for ``runtime``, as a plan for it (the listing's fields)."""
    info = device.transport.request("GET", f"/v1/models/{family}", params={"runtime": runtime}).json()
    return [PlanResponse.model_validate({
        **p, "plan_id": f"{family}@{info['version']}/{p['pattern_id']}", "model": family,
        "version": info["version"], "cuts": info["cuts"], "activation_shape": shapes[p["cut"]],
        "predicted": COSTS}) for p in info["patterns"]]


def _logits(device: DeviceClient, plan: PlanResponse, x: np.ndarray) -> np.ndarray:
    """``x`` through the plan on ``device``: its segment downloaded, its head run, its activation
    uploaded, the logits answered (all-device: the head's own)."""
    segment, _ = device.fetch_segment(plan)
    act = device.load_head(plan, segment)(x)
    if plan.infer_url is None:
        return np.asarray(act, np.float64)
    answer = device.upload(plan, encode_for_plan(act, plan))
    return np.array([r.logits for r in answer.results], np.float64)


def _differ(torch_logits: np.ndarray, onnx_logits: np.ndarray) -> str | None:
    """Why two devices' logits of one pattern are not the same answer (None: they are): the same
    classes, and logits within 1% of their largest magnitude (a code that rounds the other way at
    the cut moves them a little; a head that computes something else, much more)."""
    if not np.array_equal(torch_logits.argmax(1), onnx_logits.argmax(1)):
        return f"classes {torch_logits.argmax(1).tolist()} vs {onnx_logits.argmax(1).tolist()}"
    off = float(np.abs(torch_logits - onnx_logits).max() / max(np.abs(torch_logits).max(), 1e-12))
    return None if off <= 1e-2 else f"logits off by {off:.2%} of their largest"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_listed_pattern_answers_on_the_torch_and_onnx_devices(served, family, tmp_path):
    live, where = served
    artifact = json.loads((where["root"] / "artifacts" / family / "artifact.json").read_text())
    shapes = {c["index"]: c["activation_shape"] for c in artifact["cuts"]}
    cuts = len(shapes)
    started = time.perf_counter()
    x = torch.randn((INPUTS, *INPUT_SHAPE), generator=torch.Generator().manual_seed(3)).numpy()
    settings = DeviceSettings(server=live.url, cache_dir=tmp_path / "cache")
    answers: dict[str, dict[str, np.ndarray]] = {}
    with DeviceRuntime(settings) as torch_device, OnnxDeviceRuntime(settings, threads=1) as onnx_device:
        for device, runtime in ((torch_device, "torch"), (onnx_device, "onnx")):
            plans = _plans(device, family, runtime, shapes)
            answers[runtime] = {}
            for plan in plans:
                answers[runtime][plan.plan_id] = _logits(device, plan, x)
            # and once as a user would: planned by the server, carried out by the device
            run = device.infer(x, family, 0.05, rate_bps=1e6)
            assert len(run.predictions) == INPUTS
    both = answers["torch"].keys() & answers["onnx"].keys()
    differ = {p: why for p in both if (why := _differ(answers["torch"][p], answers["onnx"][p]))}
    assert differ == {}, differ
    print(f"{family}: {cuts} legal cuts; patterns run: torch {len(answers['torch'])}, onnx "
          f"{len(answers['onnx'])}, {len(both)} on both with the same classes and logits "
          f"({time.perf_counter() - started:.1f} s)")
