"""Settings of ``qpart device …`` take effect: a flag overrides the environment, which overrides
the default; the runtime and the profiler are seams that keep what the command built."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from qpart.client.cli import device_app
from qpart.client.errors import DeviceError
from qpart.client.plans import ModelMetadata
from qpart.client.settings import DeviceSettings


@pytest.fixture(autouse=True)
def no_qpart_environment(monkeypatch):
    for name in [k for k in os.environ if k.startswith("QPART_")]:
        monkeypatch.delenv(name)


def invoke(args: list[str], env: dict[str, str]) -> str:
    result = CliRunner().invoke(device_app, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.output


def test_infer_reads_the_environment_and_a_flag_overrides_it(monkeypatch, tmp_path):
    seen: list[DeviceSettings] = []

    class Runtime:  # stands in for client.runtime.DeviceRuntime: keeps the settings, plans nothing
        def __init__(self, settings, **_):
            seen.append(settings)

        def metadata(self, model):
            return ModelMetadata()

        def infer(self, *_, **__):
            raise DeviceError("stopped by the test")

        infer_file = infer  # one image file: offered as itself (ADR 0014)

        def close(self):
            pass

    runtime = ModuleType("qpart.client.runtime")
    runtime.DeviceRuntime = Runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qpart.client.runtime", runtime)
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(image)
    env = {"QPART_DEVICE_SERVER": "http://env.test:1", "QPART_DEVICE_CACHE_DIR": str(tmp_path / "env"),
           "QPART_DEVICE_TOKEN": "from-env", "QPART_DEVICE_RETRIES": "2"}
    assert "stopped by the test" in invoke(["infer", str(image)], env)
    invoke(["infer", str(image), "--server", "http://flag.test:2", "--cache-dir", str(tmp_path / "flag"),
            "--token", "from-flag"], env)
    from_env, flagged = seen
    assert (from_env.server, from_env.cache_dir, from_env.retries) == (
        "http://env.test:1", tmp_path / "env", 2)
    assert from_env.token is not None and from_env.token.get_secret_value() == "from-env"
    assert (flagged.server, flagged.cache_dir, flagged.retries) == (
        "http://flag.test:2", tmp_path / "flag", 2)
    assert flagged.token is not None and flagged.token.get_secret_value() == "from-flag"


def test_profile_asks_the_server_of_the_environment_unless_a_flag_names_one(monkeypatch, tmp_path):
    asked: list[str] = []

    def send(self, request, **_):  # the device's Transport sends through httpx.Client
        asked.append(str(request.url))
        raise httpx.ConnectError("nobody there")

    monkeypatch.setitem(sys.modules, "qpart.client.profiler", ModuleType("qpart.client.profiler"))
    sys.modules["qpart.client.profiler"].profile_device = None  # type: ignore[attr-defined]
    monkeypatch.setattr(httpx.Client, "send", send)
    env = {"QPART_DEVICE_SERVER": "http://env.test:1", "QPART_DEVICE_RETRIES": "0"}
    args = ["profile", "--model", "fmnist-cnn", "--out", str(tmp_path / "p.json")]
    invoke(args, env)
    invoke([*args, "--server", "http://flag.test:2"], env)
    assert asked == ["http://env.test:1/v2/models/fmnist-cnn", "http://flag.test:2/v2/models/fmnist-cnn"]


@pytest.mark.parametrize("command", [["cache", "list"], ["cache", "prune", "--max-bytes", "0"]])
def test_cache_commands_read_the_environment_and_a_flag_overrides_it(monkeypatch, tmp_path, command):
    opened: list[tuple[Path, int]] = []

    class Cache:  # stands in for SegmentCache: keeps the folder and the limit it is opened with
        def __init__(self, folder, max_bytes, transport):
            opened.append((folder, max_bytes))

        def entries(self):
            return []

        def prune(self, max_bytes):
            return []

    monkeypatch.setattr("qpart.client.segment_cache.SegmentCache", Cache)
    env = {"QPART_DEVICE_CACHE_DIR": str(tmp_path / "env"), "QPART_DEVICE_CACHE_MAX_BYTES": "4096"}
    invoke(command, env)
    invoke([*command, "--cache-dir", str(tmp_path / "flag")], env)
    assert opened == [(tmp_path / "env", 4096), (tmp_path / "flag", 4096)]


def test_help_shows_the_default_and_the_variable():
    out = CliRunner().invoke(device_app, ["infer", "--help"], env={"COLUMNS": "300"}).output
    assert "default: http://127.0.0.1:8000, env QPART_DEVICE_SERVER" in out
    assert "env QPART_DEVICE_CACHE_DIR" in out and "env QPART_DEVICE_TOKEN" in out


@pytest.mark.parametrize("names", [("T-shirt/top", "Trouser", "Pullover"), None])
def test_infer_prints_each_predicted_class_index_with_its_card_name(monkeypatch, tmp_path, names):
    from qpart.client.device import InferenceRun
    from qpart.client.plans import PlanResponse, TailResponse
    from tests.client.samples import ANSWER, PLAN

    class Runtime:  # answers in the server's place: two samples, classes 1 and 2
        def __init__(self, settings, **_):
            pass

        def infer(self, *_, **__):
            run = InferenceRun(PlanResponse.model_validate(PLAN), predictions=[1, 2],
                               timings_s={"total": 0.01})
            run.results.extend(TailResponse.model_validate(ANSWER).results * 2)
            return run

        def metadata(self, model):  # the card: fetched once, for the preprocessing and the names
            assert model == "fmnist-cnn"
            return ModelMetadata(parameters={} if names is None else {"labels": json.dumps(names)})

        def close(self):
            pass

    runtime = ModuleType("qpart.client.runtime")
    runtime.DeviceRuntime = Runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qpart.client.runtime", runtime)
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(image)
    env = {"QPART_DEVICE_CACHE_DIR": str(tmp_path / "cache")}
    text = invoke(["infer", str(image), str(image)], env)
    doc = json.loads(invoke(["infer", str(image), str(image), "--json"], env))
    assert doc["results"][0]["top_k"] == [{"label": 1, "probability": 0.8}]  # as the server sent it
    if names is None:
        assert "predictions: 1, 2" in text
        assert doc["predictions"] == [{"label": 1}, {"label": 2}]
    else:
        assert "predictions: 1 (Trouser), 2 (Pullover)" in text
        assert doc["predictions"] == [{"label": 1, "name": "Trouser"}, {"label": 2, "name": "Pullover"}]


def test_class_names_come_from_the_models_v2_metadata(tmp_path):
    from qpart.client.device import DeviceClient
    from qpart.client.errors import ServerAnswerError
    from qpart.client.transport import Transport

    answers = {"fmnist-cnn": {"parameters": {"labels": '["a","b"]'}}, "bare": {"name": "bare"},
               "broken": {"parameters": {"labels": "[1, 2]"}}}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers[request.url.path.removeprefix("/v2/models/")])

    settings = DeviceSettings(server="http://server.test", cache_dir=tmp_path)
    mock = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    transport = Transport(settings, mock)
    with DeviceClient(settings, transport=transport) as device:
        assert device.class_names("fmnist-cnn") == ("a", "b")
        assert device.class_names("bare") is None
        with pytest.raises(ServerAnswerError, match="labels"):
            device.class_names("broken")


def test_profile_is_named_after_its_file_unless_a_name_is_given(monkeypatch, tmp_path):
    from qpart.profiles.devices import MeasuredHeads, get_device

    written: list[str] = []

    def profile_device(base, model, version, *, name, **_):
        heads = MeasuredHeads(version=version, head_s=[0.0, 0.001], warmup=2, repeats=5)
        return base.model_copy(update={"name": name, "measured": {model: heads}})

    monkeypatch.setitem(sys.modules, "qpart.client.profiler", ModuleType("qpart.client.profiler"))
    sys.modules["qpart.client.profiler"].profile_device = profile_device  # type: ignore[attr-defined]
    monkeypatch.setattr("qpart.profiles.devices.save_device_profile", lambda p, out: written.append(p.name))
    args = ["profile", "--model", "fmnist-cnn", "--version", "v1", "--base", "jetson-nano"]
    outputs = [CliRunner().invoke(device_app, [*args, *extra], env={}).output
               for extra in (["--out", str(tmp_path / "my-phone.json")],
                             ["--out", str(tmp_path / "p.json"), "--name", "lab-pi"],
                             ["--out", str(tmp_path / "bad name.json")])]
    assert written == ["my-phone", "lab-pi"]
    assert "(profile my-phone)" in outputs[0] and "(profile lab-pi)" in outputs[1]
    output = outputs[2]
    assert get_device("jetson-nano").name == "jetson-nano"
    assert "profile name 'bad name'" in output
