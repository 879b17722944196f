"""The CLI's errors, run as a user runs it: one ``error: …`` line on stderr, a non-zero exit, and a
traceback only with ``--debug`` or ``QPART_DEBUG=1``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port

BOX = ("╭", "│", "╰", "┏", "┃")


def qpart(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QPART_")}
    full = {**clean, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "qpart", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120, check=False)


def one_line_error(done: subprocess.CompletedProcess[str], status: int) -> str:
    """The single error line of a failed run, after checking there is nothing else."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == status, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and not any(c in done.stderr for c in BOX), done.stderr
    assert lines[0].startswith("error: "), lines
    return lines[0]


def register(tmp_path: Path, factory: str, shape: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return qpart("models", "register", "--name", "mine", "--factory", factory, "--weights",
                 str(tmp_path / "w.safetensors"), "--input-shape", shape, "--registry",
                 str(tmp_path / "registry.json"), *extra, cwd=tmp_path)


def test_a_bad_model_factory_is_one_line_naming_the_module(tmp_path):
    line = one_line_error(register(tmp_path, "nonexistent.mod:fn", "1,28,28"), 1)
    assert "nonexistent.mod" in line and "factory" in line
    assert not (tmp_path / "registry.json").exists()


def test_a_malformed_input_shape_says_the_form_is_c_h_w(tmp_path):
    line = one_line_error(register(tmp_path, "mynets:tiny", "3x224x224"), 2)
    assert "3x224x224" in line and "C,H,W" in line


def test_an_unreadable_image_is_reported_before_any_network_use(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really an image")
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: an attempt to connect would show
    done = qpart("device", "infer", "broken.png", "--server", nobody, "--cache-dir", str(tmp_path / "c"),
                 cwd=tmp_path)
    line = one_line_error(done, 1)
    assert "broken.png is not a readable image" in line


@pytest.mark.parametrize(("make", "reason"), [
    pytest.param(lambda root: root / "missing", "does not exist", id="missing-folder"),
    pytest.param(lambda root: root, "holds no artifact.json", id="folder-without-artifact"),
])
def test_serve_refuses_an_artifacts_folder_without_artifacts(tmp_path, make, reason):
    (tmp_path / "fmnist-cnn").mkdir()  # a model folder, but no artifact.json in it
    folder = make(tmp_path)
    line = one_line_error(qpart("serve", "--artifacts", str(folder), cwd=tmp_path), 2)
    assert str(folder) in line and reason in line and "QPART_ARTIFACTS" in line


def test_serve_refuses_a_missing_artifacts_folder_named_by_the_environment(tmp_path):
    done = qpart("serve", cwd=tmp_path, env={"QPART_ARTIFACTS": str(tmp_path / "nowhere")})
    assert "nowhere does not exist" in one_line_error(done, 2)


@pytest.mark.parametrize(("args", "env", "expected"), [
    pytest.param(["serve"], {"QPART_PORT": "abc"}, ["QPART_PORT='abc'", "valid integer"], id="port-abc"),
    pytest.param(["serve"], {"QPART_PORT": "70000"}, ["QPART_PORT='70000'", "less than or equal to 65535"],
                 id="port-range"),
    pytest.param(["calibrate", "--model", "fmnist-cnn", "--out", "out"], {"QPART_CALIB_ESTIMATOR": "slow"},
                 ["QPART_CALIB_ESTIMATOR='slow'", "'fast' or 'direct'"], id="calib-estimator"),
    pytest.param(["calibrate", "--model", "fmnist-cnn", "--out", "out"], {"QPART_CALIB_FIT_SAMPLES": "50"},
                 ["QPART_CALIB_FIT_SAMPLES='50'", "greater than or equal to 100"], id="calib-fit-samples"),
    pytest.param(["calibrate", "--model", "fmnist-cnn", "--out", "out"], {"QPART_CALIB_LEVELS": "0.01,0.02"},
                 ["QPART_CALIB_LEVELS cannot be parsed", "JSON", "[0.001, 0.0025"], id="calib-levels-json"),
    pytest.param(["device", "cache", "list"], {"QPART_DEVICE_RETRIES": "99"},
                 ["QPART_DEVICE_RETRIES='99'", "less than or equal to 20"], id="device-retries"),
])
def test_a_bad_environment_value_names_the_variable_and_what_it_accepts(tmp_path, args, env, expected):
    line = one_line_error(qpart(*args, cwd=tmp_path, env=env), 2)
    for part in expected:
        assert part in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback_and_still_the_error_line(tmp_path, how):
    args = ["--debug"] if how == "flag" else []
    env = {"QPART_DEBUG": "1"} if how == "env" else {}
    done = qpart(*args, "serve", "--artifacts", str(tmp_path / "missing"), cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: artifacts folder")


@pytest.mark.parametrize("group", [[], ["device"], ["models"], ["device", "cache"]])
def test_version(tmp_path, group):
    from importlib.metadata import version

    done = qpart(*group, "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"qpart {version('qpart-serving')}"


def test_the_demo_refuses_a_port_another_server_holds(tmp_path):
    """Its readiness probe would otherwise be answered by whatever listens there."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = qpart("demo", "--artifacts", str(REPO / "artifacts"), "--port", str(port), cwd=tmp_path)
    assert f"port {port} on 127.0.0.1 is in use" in one_line_error(done, 1)
