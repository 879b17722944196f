"""Acceptance 1 of issue 25: the torch-free device (``qpart device infer --runtime onnx``, in a
process where ``import torch`` fails) against the torch device, on the same test images of both
reference models at the 1% demand, over a live ``qpart serve``: top-1 of each, and the plans.

    python -m bench.micro.onnx_accuracy --limit 1000 --out bench/results/onnx_accuracy.json

``--onnx-venv DIR``: the ONNX device runs from that virtualenv's own ``qpart`` (e.g. a fresh one
holding only the wheel with its ``device-onnx`` extra: ``python3 -m venv DIR && DIR/bin/pip install
'qpart_serving-*.whl[device-onnx]'``), with no ``PYTHONPATH``; the JSON lists what it holds, torch
or not. Without it, the checkout's interpreter runs it behind a shim on which ``import torch`` fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench import REPO, free_port, provenance, start_server
from bench.micro.browser_device import profile_for_cut

IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
NOTORCH = REPO / "tests" / "client" / "notorch"
# A device on a fast link that plans a split with a head segment (else there is no head to run).
FAST = {"schema_version": 2, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}



def _infer(url: str, model: str, runtime: str, limit: int, demand: float, device: str, rate_mbps: float,
           folder: Path, onnx_venv: Path | None = None) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    profile = folder / "device.json"
    if device.startswith("cut"):  # a measured profile that makes that cut the cheapest plan
        info = httpx.get(f"{url}/v1/models/{model}", timeout=30).json()
        profile.write_text(json.dumps(profile_for_cut(model, info["version"], int(device[3:]), info["cuts"])))
    else:
        profile.write_text(json.dumps(FAST))
    inline = device == FAST["name"] or device.startswith("cut")
    device_args = ["--device-profile", str(profile)] if inline else ["--device", device]
    env = dict(os.environ)
    python = sys.executable
    if runtime == "onnx" and onnx_venv is not None:  # only what that virtualenv installed
        env.pop("PYTHONPATH", None)
        python = str(onnx_venv / "bin" / "python")
    elif runtime == "onnx":  # the device has no torch at all
        env["PYTHONPATH"] = os.pathsep.join([str(NOTORCH), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [python, "-m", "qpart", "device", "infer", "--runtime", runtime, "--model", model,
           "--idx", IMAGES, "--labels", LABELS, "--limit", str(limit), "--demand", str(demand),
           *device_args, "--rate-mbps", str(rate_mbps), "--server", url,
           "--cache-dir", str(folder / runtime), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=1800,
                          cwd=folder)  # not the checkout: its folders would be importable from there
    doc = json.loads(done.stdout)
    plan = doc["plan"]
    return {"accuracy": doc["accuracy"], "cut": plan["cut"], "level": plan["level"],
            "segment_runtime": (plan.get("segment") or {}).get("runtime"),
            "segment_bytes": (plan.get("segment") or {}).get("size_bytes"), "timings_s": doc["timings_s"]}


def main() -> None:
    """Both devices on both models; the JSON says each accuracy and the difference in points."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--demand", type=float, default=0.01)
    parser.add_argument("--scenarios", default="fast-board@10000,jetson-nano@20",
                        help="device@Mbit/s, comma-separated: fast-board (inline, plans all on the "
                        "device), cutK (a measured profile that makes cut K the cheapest plan) or a "
                        "shipped profile's name")
    parser.add_argument("--onnx-venv", type=Path, default=None,
                        help="a virtualenv whose own qpart runs the ONNX device (see above)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "onnx_accuracy.json")
    args = parser.parse_args()
    venv = _venv_packages(args.onnx_venv) if args.onnx_venv else None
    port = free_port()
    server = start_server(port)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for model, scenario in [(m, s) for m in ("fmnist-cnn", "fmnist-resnet")
                                    for s in args.scenarios.split(",")]:
                device, rate = scenario.split("@")
                runs = {rt: _infer(f"http://127.0.0.1:{port}", model, rt, args.limit, args.demand, device,
                                   float(rate), Path(tmp) / f"{model}-{scenario}", args.onnx_venv)
                        for rt in ("torch", "onnx")}
                gap = 100 * (runs["onnx"]["accuracy"] - runs["torch"]["accuracy"])
                rows.append({"model": model, "images": args.limit, "demand": args.demand, "device": device,
                             "rate_mbps": float(rate), **runs, "top1_gap_points": round(gap, 4)})
                t, o = runs["torch"], runs["onnx"]
                print(f"{model}, {device} at {rate} Mbit/s: torch {t['accuracy']:.4f} (cut {t['cut']}), "
                      f"onnx {o['accuracy']:.4f} (cut {o['cut']}): {gap:+.2f} points")
    finally:
        server.terminate()
        server.wait(30)
    doc: dict[str, Any] = {"provenance": provenance(), "rows": rows}
    if venv is not None:
        doc["onnx_venv"] = {"path": str(args.onnx_venv), "packages": venv,
                            "torch_installed": any(n.lower().startswith("torch") for n in venv)}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


def _venv_packages(venv: Path) -> dict[str, str]:
    """Name → version of every distribution installed in ``venv`` (``pip list``)."""
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                          capture_output=True, text=True, check=True, timeout=120)
    return {d["name"]: d["version"] for d in json.loads(done.stdout)}


if __name__ == "__main__":
    main()
