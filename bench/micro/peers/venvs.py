"""The peers' own virtualenvs, made on first use (before ``bench.micro.peer`` enters its private
network namespace, which has no package index). torch is pinned first, the CPU build on local
disk (an unpinned torch resolves to CUDA), so each peer's own requirement leaves it alone. None of
these packages is a dependency of this project."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import REPO

TORCH_PIN = "torch==2.13.0"


@dataclass(frozen=True)
class Venv:
    """A peer's virtualenv: its folder, its pinned package and what the served graph needs beside."""

    path: Path
    package: str  # "name==version"
    # what the served graph imports besides torch: models.registry's needs, and bench's own
    extra: tuple[str, ...] = ("numpy", "safetensors>=0.4", "pillow>=10", "httpx>=0.27")

    @property
    def python(self) -> Path:
        """Its interpreter."""
        return self.path / "bin" / "python"

    def installed(self, package: str) -> str | None:
        """The version of ``package`` in this venv, or None."""
        out = subprocess.run([str(self.python), "-c", f"from importlib.metadata import version; "
                              f"print(version('{package}'))"], capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else None

    def ensure(self) -> str:
        """Create or complete the venv (torch first, then the package); the package's version."""
        name, version = self.package.split("==")
        if not self.python.exists():
            print(f"creating {self.path}", file=sys.stderr)
            subprocess.run(["python3", "-m", "venv", str(self.path)], check=True)
        if self.installed("torch") is None:
            self._pip(TORCH_PIN)
        if self.installed(name) != version or any(self.installed(re.split("[<>=]", e)[0]) is None
                                                   for e in self.extra):
            self._pip(self.package, *self.extra)
        torch_version = self.installed("torch") or ""
        if not torch_version.startswith(TORCH_PIN.split("==")[1]):
            raise SystemExit(f"{self.path} holds torch {torch_version}, not {TORCH_PIN}: remove the folder")
        return version

    def _pip(self, *args: str) -> None:
        subprocess.run([str(self.path / "bin" / "pip"), "install", "-q", *args], check=True)

    def libdir(self) -> str:
        """Where this venv's libpython lives: Triton's Python backend stub must load that one, not
        another Python 3.11 of the system's (a different patch release crashes in its threading)."""
        return self._ask("import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")

    def minor(self) -> str:
        """This venv's Python as ``major.minor``."""
        return self._ask("import sys; print('%d.%d' % sys.version_info[:2])")

    def _ask(self, code: str) -> str:
        out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, check=True)
        return out.stdout.strip()


KSERVE = Venv(REPO / ".venv-kserve", "kserve==0.21.0", ("safetensors>=0.4",))
TRITON = Venv(REPO / ".venv-triton", "nvidia-pytriton==0.7.0")  # ships the tritonserver binary
LITSERVE = Venv(REPO / ".venv-litserve", "litserve==0.2.19")
