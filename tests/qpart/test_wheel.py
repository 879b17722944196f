"""The built wheel, installed (not editable) into a fresh virtualenv, exposes one import name:
``qpart``. The role folders it maps (``server``, ``models``, ...) are not importable by their own
names there, and the CLI works from the installed copy alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow
SOURCES = ("pyproject.toml", "setup.py", "README.md", "qpart", "kernels", "models", "profiles", "offline",
           "server", "client")


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv holding the wheel built from a copy of the sources (as the Dockerfiles
    copy them). Its third-party dependencies are the test environment's, on a path entry: the
    distribution under test is installed, the gigabyte of torch is not copied again."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", src, cwd=root)
    assert built.returncode == 0, built.stderr[-3000:]
    env = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    wheel = next((root / "dist").glob("qpart_serving-*.whl"))
    done = _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=root).stdout.strip())
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


def test_the_wheel_installs_qpart_alone(installed):
    python = installed / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=installed).stdout.strip())
    record = next(site.glob("qpart_serving-*.dist-info")) / "RECORD"
    tops = {line.split("/", 1)[0] for line in record.read_text().splitlines() if "/" in line}
    assert {t for t in tops if not t.endswith(".dist-info") and t != ".."} == {"qpart"}
    where = _run(python, "-c", "import qpart.server.engine as e; print(e.__file__)", cwd=installed)
    assert where.returncode == 0 and where.stdout.startswith(str(site)), where.stdout + where.stderr
    for bare in ("models", "server", "client", "kernels", "profiles", "offline"):
        answer = _run(python, "-c", f"import {bare}", cwd=installed)
        assert answer.returncode != 0 and "ModuleNotFoundError" in answer.stderr, (bare, answer.stderr)


def test_the_installed_cli_answers_version_and_lists_the_models(installed):
    qpart = installed / "bin" / "qpart"
    version = _run(qpart, "--version", cwd=installed)
    assert version.returncode == 0 and version.stdout.strip().startswith("qpart "), version.stderr
    listed = _run(qpart, "models", "--json", cwd=installed)
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {m["name"] for m in json.loads(listed.stdout)}
    assert {"fmnist-cnn", "fmnist-resnet"} <= names, listed.stdout[:500]


def test_the_wheel_ships_the_browser_device_page(installed):
    from qpart.server.api.device_page import VENDOR_FILES

    python = installed / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=installed).stdout.strip())
    web = site / "qpart" / "server" / "web"
    assert {"index.html", "device.js", "packet.js", "preprocess.js", "device.css"} <= {
        p.name for p in web.iterdir()}
    assert len(list((web / "samples").glob("*.png"))) == 10
    built = [name for name in VENDOR_FILES if (REPO / "server" / "web" / "vendor" / name).is_file()]
    assert [name for name in built if (web / "vendor" / name).is_file()] == built  # after `make web`


def test_the_device_onnx_extra_resolves_to_no_torch(installed, tmp_path):
    """Issue 25, acceptance 1: what pip would install for ``qpart-serving[device-onnx]`` into a fresh
    virtualenv, resolved against the package index (``--dry-run --ignore-installed``), holds
    onnxruntime and no torch (bench.micro.onnx_accuracy --onnx-venv runs the device from such an install)."""
    python = installed / "bin" / "python"
    wheel = next((installed.parent / "dist").glob("qpart_serving-*.whl"))
    report = tmp_path / "report.json"
    done = _run(python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report", report,
                f"{wheel}[device-onnx]", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"onnxruntime", "numpy", "httpx"} <= names, sorted(names)
    heavy = {n for n in names if n.startswith("torch") or n in {"safetensors", "scipy", "onnx"}}
    assert not heavy, sorted(names)
