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


def _annotated_engine(annotation: ast.expr | None) -> bool:
    """An annotation that names ``Engine`` (``Engine``, ``engine.Engine``, ``"Engine"``)."""
    return annotation is not None and (
        (isinstance(annotation, ast.Name) and annotation.id == "Engine")
        or (isinstance(annotation, ast.Attribute) and annotation.attr == "Engine")
        or (isinstance(annotation, ast.Constant) and annotation.value == "Engine"))


def _engine_names(tree: ast.AST) -> set[str]:
    """``engine``, every parameter or variable annotated ``Engine``, and every name bound to one of
    those or to ``….engine`` (``eng = request.app.state.engine``), to a fixed point."""
    names = {"engine"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _annotated_engine(node.annotation):
            names.add(node.arg)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _annotated_engine(
                node.annotation):
            names.add(node.target.id)
    while True:
        bound = {target.id for node in ast.walk(tree)
                 if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr))
                 and node.value is not None and _is_engine(node.value, names)
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}
        if bound <= names:
            return names
        names |= bound


def _is_engine(node: ast.expr, names: set[str]) -> bool:
    """An engine name, or any ``….engine`` (``request.app.state.engine``)."""
    return (isinstance(node, ast.Name) and node.id in names) or (
        isinstance(node, ast.Attribute) and node.attr == "engine")


def reach_throughs(source: str) -> list[str]:
    """``engine.<part>.<attr>`` chains in ``source`` (through any alias of the engine), and any
    ``getattr`` on the engine, as ``line: engine.part.attr`` or ``line: getattr(engine, …)``."""
    tree = ast.parse(source)
    names = _engine_names(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and _is_engine(node.value.value, names)):
            found.append(f"{node.lineno}: engine.{node.value.attr}.{node.attr}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and node.args and _is_engine(node.args[0], names)):
            found.append(f"{node.lineno}: getattr(engine, …)")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


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


def test_the_check_follows_aliases_annotations_and_getattr():
    sample = textwrap.dedent("""
        def route(request, eng2: "Engine"):
            eng = request.app.state.engine
            again = eng
            again.segments.segment("x")
            getattr(eng, "segments")
            eng2.metrics.shed.inc()
            eng.plan(request)  # a method: allowed
    """)
    assert reach_throughs(sample) == ["5: engine.segments.segment", "6: getattr(engine, …)",
                                      "7: engine.metrics.shed"]
