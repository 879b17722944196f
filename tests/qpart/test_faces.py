"""Each role package has a face: a sorted ``__all__`` of names that resolve, loaded on first use, so
importing a face (or one light name from it) does not pull in torch or FastAPI."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

from qpart.lazy_face import FaceError, face_table
from tests.conftest import REPO

# The role folders are the links under qpart/ (ADR 0010): a new role without a face fails here.
ROLES = sorted(p.name for p in (REPO / "qpart").iterdir() if p.is_symlink())


def _ruff_order(name: str) -> tuple[int, str]:
    """ruff's RUF022 order (the house's): CONSTANTS, then Classes, then functions, each sorted."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_the_role_packages_are_the_six_of_the_dependency_table():
    assert ROLES == ["client", "kernels", "models", "offline", "profiles", "server"]


@pytest.mark.parametrize("role", ROLES)
def test_every_role_package_has_a_sorted_all_whose_names_resolve(role):
    face = importlib.import_module(f"qpart.{role}")
    public = face.__all__
    assert public, f"qpart.{role} names no public API"
    assert public == sorted(public, key=_ruff_order), f"qpart.{role}.__all__ is not sorted"
    assert len(set(public)) == len(public)
    assert set(face_table(REPO / role / "__init__.py")) == set(public)
    for name in public:
        value = getattr(face, name)
        source, attribute = face_table(REPO / role / "__init__.py")[name]
        assert value is getattr(importlib.import_module(source), attribute), (role, name)
    assert set(public) <= set(dir(face))


@pytest.mark.parametrize("role", ROLES)
def test_every_error_a_role_raises_is_on_its_face(role):
    """A caller catches what the package raises by its face's names (one error tree per package)."""
    face = importlib.import_module(f"qpart.{role}")
    errors = importlib.import_module(f"qpart.{role}.errors")
    raised = {name for name, value in vars(errors).items()
              if isinstance(value, type) and issubclass(value, BaseException)
              and value.__module__ == errors.__name__ and not name.startswith("_")}
    assert raised, f"qpart.{role}.errors defines no error"
    missing = sorted(raised - set(face.__all__))
    assert not missing, f"qpart.{role} does not export {missing}"


@pytest.mark.parametrize("role", ROLES)
def test_a_face_refuses_a_name_it_does_not_export(role):
    face = importlib.import_module(f"qpart.{role}")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        face.no_such_name  # noqa: B018


def _loaded(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(("code", "heavy"), [
    *[(f"import qpart.{role}", {"torch", "fastapi", "uvicorn", "scipy", "onnx", "httpx"}) for role in ROLES],
    ("from qpart.server import ServerSettings", {"fastapi", "starlette", "uvicorn", "torch"}),
    ("from qpart.client import DeviceSettings", {"torch", "httpx", "onnxruntime"}),
    ("from qpart.offline import CalibrationSettings", {"torch", "scipy"}),
    ("from qpart.profiles import DeviceProfile, load_artifact", {"torch"}),
    ("from qpart.kernels import quantize_pack", {"torch", "onnx"}),
])
def test_light_imports_stay_light(code, heavy):
    assert not _loaded(code) & heavy, code


def _package(tmp_path, monkeypatch, name: str, module: tuple[str, str], imports: str,
             names: list[str]) -> None:
    """A package ``name`` on the path: one ``module`` (file name, source) and a face that imports
    ``imports`` under TYPE_CHECKING and lists ``names`` in ``__all__``."""
    package = tmp_path / name
    package.mkdir()
    (package / module[0]).write_text(module[1])
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        from typing import TYPE_CHECKING
        from qpart.lazy_face import attach
        if TYPE_CHECKING:
            {imports}
        __all__ = {names!r}
        if not TYPE_CHECKING:
            __getattr__, __dir__ = attach(__name__, __file__)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))


def _forget(monkeypatch, name: str) -> None:
    """Drop package ``name`` and its modules from ``sys.modules`` (each test imports its own)."""
    for loaded in [m for m in sys.modules if m.split(".")[0] == name]:
        monkeypatch.delitem(sys.modules, loaded)


def test_a_face_whose_all_and_imports_differ_is_refused_at_import(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "lopsided", ("parts.py", "def used(): return 1\n"),
             "from lopsided.parts import used", ["used", "forgotten"])
    with pytest.raises(FaceError, match="forgotten"):
        importlib.import_module("lopsided")
    _forget(monkeypatch, "lopsided")


def test_a_face_refuses_a_public_name_that_is_also_a_submodule(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "shadowed", ("tool.py", "def tool(): return 1\n"),
             "from shadowed.tool import tool", ["tool"])
    with pytest.raises(FaceError, match=r"\['tool'\] are also its submodules"):
        importlib.import_module("shadowed")
    _forget(monkeypatch, "shadowed")


def test_a_lazy_name_is_loaded_once_and_then_held_by_the_package(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "counted",
             ("parts.py", "import itertools\nLOADS = itertools.count()\nnext(LOADS)\nVALUE = 7\n"),
             "from counted.parts import VALUE as ANSWER", ["ANSWER"])
    counted = importlib.import_module("counted")
    assert "counted.parts" not in sys.modules
    assert counted.ANSWER == 7 and vars(counted)["ANSWER"] == 7
    assert "counted.parts" in sys.modules and dir(counted).count("ANSWER") == 1
    _forget(monkeypatch, "counted")

