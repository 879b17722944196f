"""The browser device's per-phase times (issue 25): the page at ``/device/`` in Debian's chromium,
headless, against a live ``qpart serve`` on the committed artifacts. For each cut of each model
(forced by a measured inline profile on a fast link), a fresh download of the head segment, then
``--images`` test images one by one: download (with the sha256 check), session creation,
preprocessing, head, encode, upload and server seconds as the page measures them.

    python -m bench.micro.browser_device --images 20 --out bench/results/browser_device.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench import REPO, free_port, provenance, start_server
from qpart.client.inputs import read_idx_images

IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
PER_IMAGE = ("preprocess", "head", "encode", "upload", "server")



def profile_for_cut(model: str, version: str, cut: int, cuts: int) -> dict[str, Any]:
    """A device whose measured heads make ``cut`` the cheapest plan on a fast link (not always: a
    cut whose tail costs the server as much as the whole model's loses to cut 0; ``asked_cut``)."""
    head_s = [0.0 if k == 0 else 1e-5 if k == cut else 10.0 for k in range(cuts)]
    return {"schema_version": 2, "name": "bench-browser", "flops_per_s": 5e11, "power_compute_w": 2.0,
            "power_tx_w": 1.0, "rtt_s": 0.0,
            "measured": {model: {"version": version, "head_s": head_s, "warmup": 0, "repeats": 1}}}


def _pngs(count: int, folder: Path) -> list[Path]:
    files = []
    for i, image in enumerate(read_idx_images(Path(IMAGES), limit=count)):
        path = folder / f"t10k-{i:05d}.png"
        Image.fromarray(np.rint(image[0] * 255).astype(np.uint8), "L").save(path)
        files.append(path)
    return files


def _run(page: Any, files: list[Path], model: str, device: dict[str, Any]) -> dict[str, Any]:
    page.evaluate("window.qpartForgetSegments()")
    page.set_input_files("#files", [str(f) for f in files])
    page.fill("#model", model)
    page.fill("#device", json.dumps(device))
    page.fill("#rate", "100000")
    page.click("#run")
    page.wait_for_selector('#status[data-state="done"], #status[data-state="error"]', timeout=300_000)
    if page.get_attribute("#status", "data-state") == "error":
        raise RuntimeError(page.inner_text("#status"))
    run: dict[str, Any] = page.evaluate("window.qpartLastRun")
    return run


def _row(model: str, asked: int, run: dict[str, Any]) -> dict[str, Any]:
    plan = run["plan"]
    row: dict[str, Any] = {
        "model": model, "asked_cut": asked, "cut": plan["cut"], "pattern_id": plan["plan_id"].split("/")[-1],
        "activation_bits": plan["activation_bits"], "images": len(run["results"]),
        "segment_bytes": run["downloaded_bytes"], "upload_bytes": run["results"][0]["bytes_up"],
        "cross_origin_isolated": run["isolated"], "plan_s": run["plan_s"], "download_s": run["download_s"],
        "session_s": run["session_s"]}
    for phase in PER_IMAGE:
        values = [r["times"][phase] for r in run["results"] if phase in r["times"]]
        row[f"{phase}_s"] = statistics.median(values) if values else None
    return row


def _measure(page: Any, url: str, files: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for model in ("fmnist-cnn", "fmnist-resnet"):
        info = httpx.get(f"{url}/v1/models/{model}", timeout=30).json()
        version, cuts = info["version"], info["cuts"]
        # A first session outside the figures: WebAssembly is compiled once per page.
        _run(page, files[:1], model, profile_for_cut(model, version, cuts - 1, cuts))
        for cut in range(cuts):
            row = _row(model, cut, _run(page, files, model, profile_for_cut(model, version, cut, cuts)))
            rows.append(row)
            ms = {k: (row[f"{k}_s"] or 0) * 1e3 for k in ("download", "session", *PER_IMAGE)}
            print(f"{model:14} cut {row['cut']} ({row['activation_bits']:>2} bits): "
                  + "  ".join(f"{k} {v:.2f}" for k, v in ms.items()) + " ms")
    return rows


def main() -> None:
    """Every cut of both reference models through the page; JSON out."""
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "browser_device.json")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        files = _pngs(args.images, Path(tmp))
        server = start_server(port)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=[
                    "--disable-dev-shm-usage", *(["--no-sandbox"] if os.geteuid() == 0 else [])])
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/device/")
                page.wait_for_selector('#status[data-state="ready"]', timeout=60_000)
                rows = _measure(page, f"http://127.0.0.1:{port}", files)
                version = browser.version
                browser.close()
        finally:
            server.terminate()
            server.wait(30)
    ort_web = json.loads((REPO / "web" / "package.json").read_text())["dependencies"]["onnxruntime-web"]
    doc = {"provenance": provenance(), "browser": f"chromium {version} (headless)",
           "onnxruntime_web": ort_web, "backend": "wasm", "threads": 1, "batch": 1, "images": args.images,
           "per_image_phases": "medians over the images", "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
