"""What ``qpart device infer`` prints for a lossless plan, and its refusal of labels past the card's
classes (issue 48)."""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from qpart.client.cli import device_app
from qpart.client.plans import ModelMetadata, PlanResponse, TailResponse
from tests.client.samples import ANSWER, PLAN

NAMES = '["T-shirt/top", "Trouser", "Pullover"]'


def _runtime(monkeypatch, lossless: bool) -> list[str]:
    """A runtime answering two samples in the server's place with a plan (lossless or not); the
    returned list records each infer call."""
    calls: list[str] = []

    class Runtime:
        def __init__(self, settings, **_):
            pass

        def infer(self, *_, **__):
            from qpart.client.device import InferenceRun

            calls.append("infer")
            plan = PlanResponse.model_validate({**PLAN, "lossless": lossless})
            run = InferenceRun(plan, predictions=[1, 2], timings_s={"total": 0.01})
            run.results.extend(TailResponse.model_validate(ANSWER).results * 2)
            return run

        def metadata(self, model):
            return ModelMetadata(parameters={"labels": NAMES})

        def close(self):
            pass

    module = ModuleType("qpart.client.runtime")
    module.DeviceRuntime = Runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qpart.client.runtime", module)
    return calls


def _images(tmp_path):
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(image)
    return [str(image), str(image)]


def test_a_lossless_plan_says_so(monkeypatch, tmp_path):
    env = {"QPART_DEVICE_CACHE_DIR": str(tmp_path / "cache")}
    _runtime(monkeypatch, lossless=True)
    said = CliRunner().invoke(device_app, ["infer", *_images(tmp_path)], env=env).output
    assert "(lossless: no quantized pattern is certified at this demand)" in said
    _runtime(monkeypatch, lossless=False)
    assert "lossless" not in CliRunner().invoke(device_app, ["infer", *_images(tmp_path)], env=env).output


def test_labels_past_the_cards_classes_are_refused_before_any_inference(monkeypatch, tmp_path):
    calls = _runtime(monkeypatch, lossless=False)
    labels = tmp_path / "labels.txt"
    labels.write_text("1\n7\n")
    result = CliRunner().invoke(device_app, ["infer", *_images(tmp_path), "--labels", str(labels)],
                                env={"QPART_DEVICE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 2 and calls == []
    assert f"error: {labels} holds class 7, and fmnist-cnn has 3 classes (0 to 2)" in result.output
    labels.write_text("1\n2\n")
    result = CliRunner().invoke(device_app, ["infer", *_images(tmp_path), "--labels", str(labels)],
                                env={"QPART_DEVICE_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0 and "accuracy: 1.0000 on 2 inputs" in result.output
