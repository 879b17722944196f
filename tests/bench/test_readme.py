"""bench/README.md reports current figures on one page: every file it names exists, and it stays
short (issue 53)."""

from __future__ import annotations

import re

from bench import REPO

BENCH = REPO / "bench"
PAGES = [BENCH / "README.md", BENCH / "HISTORY.md", BENCH / "results" / "README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RESULT = re.compile(r"(?<![\w/.-])((?:bench/)?results/[\w./{},*<>-]+\.(?:json|md|png|log))")


def test_every_relative_link_on_the_benchmark_pages_resolves():
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links {target}: missing"


def test_every_results_file_bench_readme_names_exists():
    text = (BENCH / "README.md").read_text()
    named = [n for n in RESULT.findall(text) if not set(n) & set("{}*<>")]  # patterns, not files
    assert named, "the README names no result file"
    for name in named:
        path = REPO / name if name.startswith("bench/") else BENCH / name
        assert path.is_file(), f"bench/README.md names {name}, which is missing"


def test_bench_readme_is_at_most_250_lines():
    assert len((BENCH / "README.md").read_text().splitlines()) <= 250
