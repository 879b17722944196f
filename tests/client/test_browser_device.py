"""The browser device (issue 25, acceptance 3): the page at ``/device/`` in Debian's chromium,
headless, driven by Playwright, against a live server over a real socket. Its classes equal the
Python ONNX device's for the same plan, it shows the per-phase times, and its packets are the
kernels' bytes for the same activation."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from qpart.client.inputs import read_idx_images
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.plans import PacketFormat, PlanResponse
from qpart.client.settings import DeviceSettings
from qpart.client.uploads import encode_for_plan
from qpart.models.registry import get_model
from qpart.server.api.device_page import VENDOR_FILES, WEB_DIR
from tests.conftest import LiveServer, first_middle_cut

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PHASES = ("download", "session", "head", "encode", "upload", "server")


def _missing(reason: str) -> None:
    """Skip where a developer lacks the browser; in CI (which installs it) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run installs it")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (it is in the dev extra: pip install -e '.[dev]')")
    if not Path(CHROMIUM).is_file():
        _missing("chromium is not installed (Debian package chromium: apt-get install chromium)")
    if not all((WEB_DIR / "vendor" / name).is_file() for name in VENDOR_FILES):
        _missing("the page's onnxruntime-web is not built: run `make web`")
    with sync_playwright() as playwright:
        # As root, chromium refuses to start without --no-sandbox (CI runs as root).
        args = ["--disable-dev-shm-usage", *(["--no-sandbox"] if os.geteuid() == 0 else [])]
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield launched
        launched.close()


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/device/")
    page.wait_for_selector('#status[data-state="ready"]', timeout=60_000)
    return page, errors


def run_page(page: Any, files: list[Path] | None = None, *, device: str | None = None,
             rate_mbps: float | None = None, token: str | None = None) -> dict[str, Any]:
    """Fill the form, press Run, wait for the answer; ``window.qpartLastRun`` (or the error)."""
    if files is not None:
        page.set_input_files("#files", [str(f) for f in files])
    if device is not None:
        page.fill("#device", device)
    if rate_mbps is not None:
        page.fill("#rate", str(rate_mbps))
    if token is not None:
        page.fill("#token", token)
    page.click("#run")
    page.wait_for_selector('#status[data-state="done"], #status[data-state="error"]', timeout=120_000)
    if page.get_attribute("#status", "data-state") == "error":
        return {"error": page.inner_text("#status")}
    run: dict[str, Any] = page.evaluate("window.qpartLastRun")
    return run


def profile_for_cut(version: str, cut: int, cuts: int) -> str:
    """An inline device profile whose measured heads make ``cut`` the cheapest plan at a fast link."""
    head_s = [0.0 if k == 0 else 1e-5 if k == cut else 10.0 for k in range(cuts)]
    return json.dumps({"schema_version": 2, "name": "browser-test", "flops_per_s": 5e11,
                       "power_compute_w": 2.0, "power_tx_w": 1.0, "rtt_s": 0.0,
                       "measured": {"fmnist-cnn": {"version": version, "head_s": head_s, "warmup": 0,
                                                   "repeats": 1}}})


def python_classes(url: str, plan: PlanResponse, x: np.ndarray, cache: Path) -> list[int]:
    """The Python ONNX device (client/onnx_runtime.py) on the same plan, image by image as the page."""
    with OnnxDeviceRuntime(DeviceSettings(server=url, cache_dir=cache), threads=1) as device:
        segment, _ = device.fetch_segment(plan)
        head = device.load_head(plan, segment)
        classes = []
        for i in range(len(x)):
            act = head(x[i : i + 1])
            if plan.infer_url is None:
                logits = act[0]
            else:
                logits = np.array(device.upload(plan, encode_for_plan(act, plan)).results[0].logits)
            classes.append(int(np.argmax(logits)))
    return classes


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[np.ndarray, list[Path]]:
    """The first 20 test images as float32 [20, 1, 28, 28] and as PNG files (lossless)."""
    x = read_idx_images(Path(IMAGES), limit=20)
    folder = tmp_path_factory.mktemp("pngs")
    files = []
    for i, image in enumerate(x):
        path = folder / f"t10k-{i:05d}.png"
        Image.fromarray(np.rint(image[0] * 255).astype(np.uint8), "L").save(path)
        files.append(path)
    return x, files


@pytest.fixture(scope="module")
def every_cut_server(every_cut: Path) -> Iterator[LiveServer]:
    """A live server on fmnist-cnn calibrated at every cut: the page's heads are checked at middle
    cuts (5 and 7) that the committed artifact's calibration left out (ADR 0025)."""
    live = LiveServer(every_cut)
    live.wait_ready()
    yield live
    live.stop()


def _version(server: LiveServer) -> tuple[str, int]:
    import httpx

    info = httpx.get(f"{server.url}/v1/models/fmnist-cnn", timeout=30).json()
    return info["version"], info["cuts"]


@pytest.fixture(scope="module")
def model_version(server) -> tuple[str, int]:
    return _version(server)


# cuts 5 and 7 (every-cut artifact): tails a third and a tenth of the whole model's, robust plans;
# and the committed artifact's first calibrated cut between the input and the output
@pytest.mark.parametrize(("artifacts", "cut"), [("every-cut", 5), ("every-cut", 7), ("committed", "middle")])
def test_the_page_classifies_20_images_as_the_python_onnx_device(browser, server, every_cut_server, images,
                                                                 artifacts, cut, tmp_path):
    x, files = images
    server = every_cut_server if artifacts == "every-cut" else server
    version, cuts = _version(server)
    if cut == "middle":
        import httpx

        cut = first_middle_cut(httpx.get(f"{server.url}/v1/models/fmnist-cnn", timeout=30).json())
    page, errors = open_page(browser, server.url)
    run = run_page(page, files, device=profile_for_cut(version, cut, cuts), rate_mbps=1e5)
    assert "error" not in run, run
    plan = PlanResponse.model_validate(run["plan"])
    assert plan.cut == cut and plan.segment is not None and plan.infer_url is not None
    assert plan.activation_bits < 32 and run["downloaded_bytes"] == plan.segment.size_bytes
    assert run["isolated"]  # COOP + COEP: 5 us timers for the encode phase
    got = [r["label"] for r in run["results"]]
    assert len(got) == 20
    assert got == python_classes(server.url, plan, x, tmp_path / "cache")
    assert all(set(PHASES[2:]) <= r["times"].keys() for r in run["results"])
    # The page shows every phase's time: a number in each phase's row and in each answer's.
    for phase in PHASES:
        cells = page.locator(f'#phases tr[data-phase="{phase}"] td').all_inner_texts()
        assert float(cells[1]) >= 0 and float(cells[2]) >= 0, (phase, cells)
    rows = page.locator("#results tbody tr").all()
    assert len(rows) == 20
    for row in rows:
        cells = row.locator("td").all_inner_texts()
        assert all(float(c) >= 0 for c in cells[6:10]), cells
    assert errors == []
    page.close()


def test_cut_0_sends_the_input_and_all_device_uploads_nothing(browser, server, images, model_version,
                                                              tmp_path):
    x, files = images
    version, cuts = model_version
    page, errors = open_page(browser, server.url)
    for cut in (0, cuts - 1):
        run = run_page(page, files[:3], device=profile_for_cut(version, cut, cuts), rate_mbps=1e5)
        assert "error" not in run, run
        plan = PlanResponse.model_validate(run["plan"])
        assert plan.cut == cut
        got = [r["label"] for r in run["results"]]
        assert got == python_classes(server.url, plan, x[:3], tmp_path / f"cache{cut}")
        if cut == 0:  # the input itself (PNG decoded, preprocessed), quantized: the kernels' packet
            assert plan.segment is None
            assert [r["packet_sha256"] for r in run["results"]] == [
                hashlib.sha256(encode_for_plan(x[i : i + 1], plan)).hexdigest() for i in range(3)]
        else:
            assert plan.infer_url is None and all(r["bytes_up"] == 0 for r in run["results"])
            cells = page.locator('#phases tr[data-phase="upload"] td').all_inner_texts()
            assert cells[1] == "—"
    assert errors == []
    page.close()


def test_a_shipped_sample_runs_without_choosing_files(browser, server):
    page, errors = open_page(browser, server.url)
    run = run_page(page)
    assert "error" not in run, run
    assert run["results"][0]["name"].startswith("t10k-") and run["results"][0]["label"] == 0  # a T-shirt
    # the class name is the card's, read from the model's /v2 metadata (not a table in the page)
    labels = get_model("fmnist-cnn").labels
    assert labels is not None and run["results"][0]["class_name"] == labels[0]
    assert page.locator("#results tbody tr td").nth(3).inner_text() == labels[0]
    assert errors == []
    page.close()


def _packet_in_page(page: Any, cases: list[dict[str, Any]]) -> list[bytes]:
    encoded = page.evaluate("""async (cases) => {
        const { encodePacket } = await import("/device/packet.js");
        return cases.map((c) => {
            const raw = Uint8Array.from(atob(c.x), (ch) => ch.charCodeAt(0));
            const packet = encodePacket(new Float32Array(raw.buffer), c.dims, c.bits, c.group);
            let text = "";
            for (const b of packet) text += String.fromCharCode(b);
            return btoa(text);
        });
    }""", cases)
    return [base64.b64decode(e) for e in encoded]


def test_the_pages_packets_are_the_kernels_bytes(browser, every_cut_server, images, tmp_path):
    """JS quantize + pack + header against kernels.wire for the same float32 activations: random
    ones of every width, block boundary and group size, and the real heads' activations (at every
    middle cut: the every-cut artifact)."""
    server = every_cut_server
    x, _ = images
    rng = np.random.default_rng(25)
    cases: list[tuple[np.ndarray, int, int]] = []
    for n in (1, 7, 8, 9, 196, 784, 4095, 4096, 4097, 8193, 12544):
        for bits in (1, 2, 3, 4, 5, 6, 7, 8, 32):
            act = (rng.standard_normal((1, n)) * rng.choice([1e-4, 1.0, 300.0])).astype(np.float32)
            if bits % 3 == 0:
                act[0, : n // 2] = 0.0  # constant groups, and -0.0 as a group's min
                act[0, 0] = -0.0
            group = int(rng.choice([1, 3, 128, 256, n]))
            cases.append((act, bits, min(group, n)))
    for bits in range(1, 9):  # values on and one ulp beside every rounding boundary
        qmax = (1 << bits) - 1
        scale = np.float32(0.1)
        mids = (np.arange(qmax, dtype=np.float32) + np.float32(0.5)) * scale
        edges = np.concatenate([[0, qmax * scale], mids, np.nextafter(mids, np.float32(0)),
                                np.nextafter(mids, np.float32(9))]).astype(np.float32)
        cases.append((edges[None], bits, edges.size))
    version, cuts = _version(server)
    real = 0
    with OnnxDeviceRuntime(DeviceSettings(server=server.url, cache_dir=tmp_path / "c"), threads=1) as device:
        for cut in range(1, cuts - 1):
            body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e11, "runtime": "onnx",
                    "device": json.loads(profile_for_cut(version, cut, cuts))}
            plan = PlanResponse.model_validate(device.transport.request("POST", "/v1/plan", json=body).json())
            if plan.cut != cut or plan.activation_bits >= 32:
                continue
            segment, _ = device.fetch_segment(plan)
            cases.append((device.load_head(plan, segment)(x[:1]), plan.activation_bits, plan.group_size))
            real += 1
    assert real >= 2
    page, errors = open_page(browser, server.url)
    payload = [{"x": base64.b64encode(a.astype("<f4").tobytes()).decode(), "dims": list(a.shape), "bits": b,
                "group": g} for a, b, g in cases]
    got = _packet_in_page(page, payload)
    for (act, bits, group), packet in zip(cases, got, strict=True):
        fmt = PacketFormat(activation_bits=bits, group_size=group)
        assert packet == encode_for_plan(act, fmt), (act.shape, bits, group)
    assert errors == []
    page.close()


def test_the_token_field_reaches_a_server_that_needs_one(browser, cnn_only, live_server_factory):
    live = live_server_factory(cnn_only, {"QPART_AUTH_TOKEN": "s3cret"})
    live.wait_ready()
    page, _ = open_page(browser, live.url)
    refused = run_page(page)
    assert "401" in refused["error"] and "bearer token" in refused["error"]
    run = run_page(page, token="s3cret")
    assert "error" not in run, run
    page.close()


def test_the_pages_preprocessing_is_the_models_for_unresized_pixels(browser, server):
    """normalize() in preprocess.js against models.preprocess: Pillow's luma for L, per-channel
    scale, mean and std for RGB, the same float32 values."""
    from qpart.models.preprocess import PreprocessSpec, normalize_pixels, to_pixels

    rgb = np.random.default_rng(12).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    rgba = np.concatenate([rgb, np.full((9, 7, 1), 255, np.uint8)], axis=2)
    specs = [PreprocessSpec(color="L", scale=1 / 255, mean=(0.5,), std=(0.25,)),
             PreprocessSpec(color="RGB", scale=1 / 255, mean=(0.485, 0.456, 0.406),
                            std=(0.229, 0.224, 0.225))]
    page, errors = open_page(browser, server.url)
    for spec in specs:
        got = page.evaluate("""async ([pixels, spec]) => {
            const { normalize } = await import("/device/preprocess.js");
            const out = normalize({ data: Uint8ClampedArray.from(pixels), width: 7, height: 9 }, spec);
            return { data: Array.from(out.data), dims: out.dims };
        }""", [rgba.reshape(-1).tolist(), spec.model_dump(mode="json")])
        want = normalize_pixels(to_pixels(Image.fromarray(rgb, "RGB"), spec), spec)
        assert got["dims"] == list(want.shape)
        assert np.array_equal(np.array(got["data"], np.float32), want.reshape(-1)), spec.color
    assert errors == []
    page.close()
