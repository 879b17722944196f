"""The README is a door (issue 53): short, every guide linked, every link alive, and its Python
examples, like the guides', import only from package faces and run against a live ``qpart serve``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
GUIDES = ["serving", "devices", "calibration", "operations", "your-own-model", "how-much-data"]
PAGES = [README, *sorted((REPO / "docs" / "guide").glob("*.md"))]
DOCS = [README, *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ROLES = "client|offline|server|kernels|models|profiles"
PAST_A_FACE = re.compile(rf"^\s*(?:from|import)\s+qpart\.(?:{ROLES})\.\w+", re.M)


def _examples(page: Path) -> list[str]:
    return FENCE.findall(page.read_text())


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_at_most_150_lines_of_at_most_120_characters():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README lines over 120 characters (line, length): {long}"


def test_the_readme_links_every_guide():
    text = README.read_text()
    for guide in GUIDES:
        assert (REPO / "docs" / "guide" / f"{guide}.md").is_file(), guide
        assert f"(docs/guide/{guide}.md)" in text, f"README does not link docs/guide/{guide}.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_of_the_readme_and_the_guides_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links {target}, which does not exist"
        inside = REPO.resolve() in file.parents or file == REPO.resolve()
        assert inside, f"{page.name} links outside the repository: {target}"
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name} links {target}: no such heading"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_python_examples_import_only_from_package_faces(page):
    for example in _examples(page):
        past = PAST_A_FACE.findall(example)
        assert not past, f"{page.relative_to(REPO)} imports past a face: {past}; import from qpart.<package>"


def test_the_readme_has_one_python_example_of_a_device():
    (example,) = _examples(README)
    assert "from qpart.client import" in example and "DeviceRuntime" in example


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if _examples(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_the_python_examples_run_against_a_live_server(page, server):
    for example in _examples(page):
        code = example.replace("http://127.0.0.1:8000", server.url)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              check=False, cwd=REPO)
        assert done.returncode == 0, f"{page.name}'s example failed:\n{done.stderr[-3000:]}"
        if "runtime.infer" in example:
            cut, bits, uploaded, accuracy = done.stdout.split()[:4]
            assert int(cut) >= 0 and int(bits) in {*range(1, 9), 32} and int(uploaded) > 0
            assert float(accuracy) >= 0.8, done.stdout
    assert "Traceback" not in server.output()
