"""``qpart models`` and the commands that look a model up, against hostile registry files (issue 52,
finding 10): a registry naming a built-in model is one error line, listing imports no factory, and
``python -m qpart`` imports none from the working directory."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.qpart.test_cli_errors import REPO, one_line_error, qpart

LOUD = textwrap.dedent("""
    from pathlib import Path

    Path(__file__).with_name("imported.txt").write_text("imported")
    raise RuntimeError("this module must not be imported")
""")


@pytest.fixture
def user(tmp_path) -> Path:
    """A folder with ``loud_nets.py`` (its import writes ``imported.txt``, then raises) and weights."""
    (tmp_path / "loud_nets.py").write_text(LOUD)
    save_file(torch.nn.Linear(4, 2).state_dict(), str(tmp_path / "w.safetensors"))
    return tmp_path


def registry(folder: Path, name: str, card: dict[str, object] | None = None) -> dict[str, str]:
    """A registry listing ``name`` built by ``loud_nets:tiny``; the environment that names it and
    puts ``folder`` on the import path (where the guide says a factory's package goes)."""
    entry: dict[str, object] = {"name": name, "factory": "loud_nets:tiny", "input_shape": [4],
                                "weights": str(folder / "w.safetensors")}
    if card is not None:
        entry["card"] = card
    (folder / "models.json").write_text(json.dumps({"models": [entry]}))
    return {"QPART_MODEL_REGISTRY": str(folder / "models.json"),
            "PYTHONPATH": os.pathsep.join((str(REPO), str(folder)))}


@pytest.mark.parametrize("command", [
    pytest.param(("models",), id="models"),
    pytest.param(("models", "--json"), id="models-json"),
    pytest.param(("calibrate", "--model", "fmnist-cnn", "--out", "out"), id="calibrate"),
    pytest.param(("models", "register", "--name", "other", "--factory", "loud_nets:tiny", "--weights",
                  "w.safetensors", "--input-shape", "4"), id="register"),
])
def test_a_registry_that_shadows_a_built_in_model_is_one_error_line(user, command):
    done = qpart(*command, cwd=user, env=registry(user, "fmnist-cnn"))
    line = one_line_error(done, 1)
    assert f"model registry {user / 'models.json'} names 'fmnist-cnn', a built-in reference model" in line
    assert "rename that entry" in line
    assert not (user / "imported.txt").exists()
    assert "other" not in (user / "models.json").read_text()


def test_listing_models_imports_no_factory(user, artifacts_dir):
    env = registry(user, "mine", {"params": 10, "legal_cuts": 2})
    listed = qpart("models", "--artifacts", str(user), cwd=user, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert "cuts=2  params=10" in rows["mine"] and "fmnist-cnn" in rows
    as_json = {r["name"]: r for r in json.loads(qpart("models", "--json", cwd=user, env=env).stdout)}
    assert (as_json["mine"]["cuts"], as_json["mine"]["params"]) == (2, 10)
    assert not (user / "imported.txt").exists()


def test_an_entry_registered_before_the_counts_lists_them_unknown_or_from_its_artifact(user, artifacts_dir):
    env = registry(user, "mine")
    listed = qpart("models", cwd=user, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "cuts=?  params=?" in {line.split()[0]: line for line in listed.stdout.splitlines()}["mine"]
    (user / "mine").mkdir()
    artifact = (artifacts_dir / "fmnist-cnn" / "artifact.json").read_bytes()
    (user / "mine" / "artifact.json").write_bytes(artifact)
    as_json = {r["name"]: r for r in json.loads(qpart("models", "--json", "--artifacts", str(user), cwd=user,
                                                      env=env).stdout)}
    assert as_json["mine"]["cuts"] == as_json["fmnist-cnn"]["cuts"]  # the artifact's cuts
    assert not (user / "imported.txt").exists()


def test_python_m_qpart_imports_no_factory_from_the_working_directory(user):
    done = qpart("models", "register", "--name", "mine", "--factory", "loud_nets:tiny", "--weights",
                 "w.safetensors", "--input-shape", "4", "--registry", "models.json", cwd=user)
    line = one_line_error(done, 1)
    assert "cannot import 'loud_nets'" in line and "PYTHONPATH=DIR" in line
    assert not (user / "imported.txt").exists() and not (user / "models.json").exists()
