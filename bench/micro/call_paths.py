"""How many of the project's files a call passes through on its way down, and how often it comes
back into one it had left (issue 53: "calibrate's model spec enters 12 files 34 times").

``python -m bench.micro.call_paths [--what calibrate|calibrate-spill|plan|all] [--tree] [--json PATH]``

It records the Python calls (``sys.setprofile``) of one real operation and keeps those whose code
is the project's (files under the repository root, less ``.venv/``, ``tests/`` and this file;
module bodies run by imports are left out with everything they call). A call from a non-project
frame (torch calling a model's ``forward``, numpy, this tool) hangs under the nearest project
caller. Repeated calls along the same path (a loop over batches) are merged, so the figures are
those of the call *tree*, not of how many batches ran:

- ``files``: distinct project files entered;
- ``entries``: calls whose file differs from their caller's (the operation's own call counts one);
- ``re_entries``: ``entries - files``, the entries into a file after its first: a caller that
  comes back to it (``state`` → ``data``, back in ``state``, → ``data`` again), or a callee that
  calls back into it (a ping-pong).

``dynamic_entries`` counts the same crossings without merging (it grows with the sample counts).

The operations (the same logical operation at every commit since 3c8e697; the tool imports nothing
of ``bench`` so that a copy runs in an older checkout: ``cd OLD && PYTHONPATH=OLD python
/tmp/call_paths.py``):

- ``calibrate``: ``qpart.offline.calibrate(get_model("fmnist-cnn"), settings, out)`` with
  Fashion-MNIST, 200 fit, 300 check and 200 test samples, level 0.05, one thread, into an empty
  temporary folder, from its call until it starts the noise tables (its progress sink stops it
  there): loading the model, opening and checking the sources, the job's inputs and checkpoints,
  decoding the samples and the float model's answers on them: the data path from the model spec
  down.
- ``calibrate-spill``: the same with ``spill_above_mb=0``: the samples held in files.
- ``plan``: ``Engine.plan(PlanRequest(model="fmnist-cnn", accuracy_demand=0.01, rate_bps=1e6))`` on
  an engine of the committed fmnist-cnn artifact, loaded and warmed up as ``load_engine`` builds
  it; the request once untraced (first-use caches), then traced.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any


def repo_root() -> Path:
    """The checkout whose ``qpart`` this process imports (this file may be a copy elsewhere)."""
    import qpart

    return Path(qpart.__file__).resolve().parents[1]


@dataclass
class Node:
    """A call site in the merged call tree: one function reached along one path of callers."""

    code: CodeType | None
    file: str
    children: dict[CodeType, Node] = field(default_factory=dict)


@dataclass
class Trace:
    """The merged project call tree of what ran while :meth:`record` was active."""

    is_project: Callable[[str], str | None]
    root: Node = field(default_factory=lambda: Node(None, ""))
    dynamic_entries: int = 0
    _files: dict[str, str | None] = field(default_factory=dict)

    def _file(self, code: CodeType) -> str | None:
        name = code.co_filename
        if name not in self._files:
            self._files[name] = self.is_project(name)
        return self._files[name]

    @contextmanager
    def record(self) -> Iterator[Trace]:
        """Record every call made in this thread inside the ``with`` block."""
        stack: list[Node | None] = []  # per open frame: its project node (None: in an import)
        skip = Node(None, "<import>")

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                parent = stack[-1] if stack else self.root
                if parent is skip or frame.f_code.co_name == "<module>":
                    stack.append(skip)
                    return
                file = self._file(frame.f_code)
                if file is None or parent is None:
                    stack.append(parent)
                    return
                child = parent.children.get(frame.f_code)
                if child is None:
                    child = parent.children[frame.f_code] = Node(frame.f_code, file)
                self.dynamic_entries += file != parent.file
                stack.append(child)
            elif event == "return" and stack:
                stack.pop()

        sys.setprofile(profile)
        try:
            yield self
        finally:
            sys.setprofile(None)

    def entries(self) -> Counter[str]:
        """Per project file, the calls into it from another file (merged tree)."""
        out: Counter[str] = Counter()

        def walk(node: Node) -> None:
            for child in node.children.values():
                if child.file != node.file:
                    out[child.file] += 1
                walk(child)

        walk(self.root)
        return out

    def summary(self) -> dict[str, Any]:
        """``files``, ``entries``, ``re_entries``, ``dynamic_entries`` and the entries per file."""
        per_file = self.entries()
        total = sum(per_file.values())
        return {"files": len(per_file), "entries": total, "re_entries": total - len(per_file),
                "dynamic_entries": self.dynamic_entries,
                "per_file": dict(sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])))}

    def lines(self) -> list[str]:
        """The merged tree, one call a line, ``>>`` where a call enters another file."""
        out: list[str] = []

        def walk(node: Node, depth: int) -> None:
            for child in node.children.values():
                assert child.code is not None
                mark = ">>" if child.file != node.file else "  "
                out.append(f"{'  ' * depth}{mark} {child.file}:{child.code.co_qualname}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return out


def project_file(root: Path, exclude: tuple[Path, ...]) -> Callable[[str], str | None]:
    """The path relative to ``root`` of a source file of the project's, else None."""
    def check(name: str) -> str | None:
        if name.startswith("<"):
            return None
        path = Path(name).resolve()
        if not path.is_relative_to(root) or any(path.is_relative_to(e) for e in exclude):
            return None
        return str(path.relative_to(root))

    return check


class _Stop(Exception):
    """Raised by the progress sink where the traced part of the job ends."""


class _Sink:
    def start(self, label: str, total: int) -> Callable[[int], None]:
        if label.startswith("noise tables"):
            raise _Stop(label)
        return lambda done: None


def _calibrate(spill: bool) -> Callable[[], None]:
    from qpart.models.registry import get_model
    from qpart.offline.job import calibrate
    from qpart.offline.settings import CalibrationSettings

    spec = get_model("fmnist-cnn")
    settings = CalibrationSettings(data="fashion-mnist", levels=(0.05,), fit_samples=200, check_samples=300,
                                   test_samples=200, threads=1)
    if spill:
        settings = settings.model_copy(update={"spill_above_mb": 0})

    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="call-paths-") as out:
            try:
                calibrate(spec, settings, Path(out), progress=_Sink())
            except _Stop:
                return
        raise RuntimeError("calibrate did not reach the noise tables")

    return run


def _plan() -> Callable[[], None]:
    from qpart.server.schemas import PlanRequest
    from qpart.server.settings import ServerSettings

    try:
        app = importlib.import_module("qpart.server.api.app")
    except ModuleNotFoundError:  # before 82062ad
        app = importlib.import_module("qpart.server.app")
    load_engine = app.load_engine
    folder = Path(tempfile.mkdtemp(prefix="call-paths-"))
    shutil.copytree(repo_root() / "artifacts" / "fmnist-cnn", folder / "fmnist-cnn")
    engine = load_engine(ServerSettings(artifacts=folder))
    shutil.rmtree(folder)
    request = PlanRequest(model="fmnist-cnn", accuracy_demand=0.01, rate_bps=1e6)
    engine.plan(request)

    def run() -> None:
        engine.plan(request)

    return run


OPERATIONS: dict[str, Callable[[], Callable[[], None]]] = {
    "calibrate": lambda: _calibrate(spill=False),
    "calibrate-spill": lambda: _calibrate(spill=True),
    "plan": _plan,
}


def measure(what: str) -> Trace:
    """The merged call tree of one run of the operation ``what``."""
    run = OPERATIONS[what]()
    root = repo_root()
    trace = Trace(project_file(root, (root / ".venv", root / "tests", Path(__file__).resolve())))
    with trace.record():
        run()
    return trace


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=[*OPERATIONS, "all"], default="all")
    p.add_argument("--tree", action="store_true", help="print each merged call tree too")
    p.add_argument("--json", type=Path, default=None, help="write the figures there too")
    a = p.parse_args(argv)
    root = repo_root()
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    doc: dict[str, Any] = {"commit": commit, "root": str(root)}
    for what in OPERATIONS if a.what == "all" else [a.what]:
        trace = measure(what)
        doc[what] = trace.summary()
        if a.tree:
            print(f"--- {what}", *trace.lines(), sep="\n")
        s = doc[what]
        print(f"{what} at {commit}: {s['files']} files, {s['entries']} entries, {s['re_entries']} re-entries "
              f"({s['dynamic_entries']} unmerged)")
        print("  " + ", ".join(f"{f} {n}" for f, n in s["per_file"].items()))
    if a.json is not None:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
