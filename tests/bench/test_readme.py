"""bench/README.md reports current figures on one page: every file it names exists, and it stays
short (issue 53)."""

from __future__ import annotations

import re
import subprocess

import pytest

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


def _committed_results() -> list[tuple[str, int]]:
    try:
        names = subprocess.run(["git", "ls-files", "-z", "bench/results"], cwd=REPO, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing is committed to measure")
    return [(n, (REPO / n).stat().st_size) for n in names if n and (REPO / n).is_file()]


def test_committed_results_are_small_summaries():
    """Raw grids stay outside the tree (bench/runs/, ignored): what is committed under bench/results
    is at most 20 MB in all and 2 MB a file (issue 53)."""
    files = _committed_results()
    assert files, "git lists nothing under bench/results"
    big = [f"{n} ({size:,} B)" for n, size in files if size > 2_000_000]
    assert not big, f"over 2 MB: {big}: commit a summary (python -m bench.e2e.summary), not the raw run"
    total = sum(size for _, size in files)
    assert total <= 20_000_000, f"bench/results holds {total:,} B of committed files, over 20 MB"
