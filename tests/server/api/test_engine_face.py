"""The routes call the Engine's methods, never its parts: no module of the HTTP face reads an
attribute of an engine attribute (``engine.catalog.get(...)``, ``engine.metrics.shed``), so the
engine stays a façade and not a service locator (issue 53)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

API_MODULES = sorted((REPO / "server" / "api").glob("*.py"))


def _is_engine(node: ast.expr) -> bool:
    """``engine`` itself, or any ``….engine`` (``request.app.state.engine``)."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine")


def reach_throughs(source: str) -> list[str]:
    """``engine.<part>.<attr>`` chains in ``source``, as ``line: engine.part.attr``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and _is_engine(node.value.value)):
            found.append(f"{node.lineno}: engine.{node.value.attr}.{node.attr}")
    return found


def test_the_check_reads_every_module_of_the_http_face():
    names = {p.stem for p in API_MODULES}
    assert {"routes_api", "routes_oip", "fastpath", "inference", "responses", "deps"} <= names


@pytest.mark.parametrize("module", API_MODULES, ids=lambda p: p.stem)
def test_the_http_face_calls_engine_methods_not_engine_parts(module: Path):
    assert reach_throughs(module.read_text(encoding="utf-8")) == [], (
        f"{module.relative_to(REPO)} reaches through the engine: add an Engine method")


def test_the_check_catches_a_reach_through():
    sample = textwrap.dedent("""
        def route(engine, request):
            engine.plan(request)  # a method: allowed
            model = engine.catalog.get("m", "v")
            request.app.state.engine.metrics.shed.labels(route="plan").inc()
            return engine.settings
    """)
    assert reach_throughs(sample) == ["4: engine.catalog.get", "5: engine.metrics.shed"]
