"""A package's face whose names load on first use (PEP 562), so importing a face stays light.

A role package's ``__init__.py`` names its public API once, as imports under ``if TYPE_CHECKING:``
(what mypy and editors read), lists the same names in ``__all__``, and ends with::

    if not TYPE_CHECKING:
        __getattr__, __dir__ = attach(__name__, __file__)

(mypy never sees the ``__getattr__``, so a misspelt name is still an error there).

``attach`` reads those imports from the file itself, so the table of which module holds which name
is never written twice (scientific Python's ``lazy_loader.attach_stub`` reads a stub the same way).
``import qpart.client`` then loads no torch, and ``from qpart.server import ServerSettings`` loads
the settings module alone, not FastAPI.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path


class FaceError(ImportError):
    """A face whose ``__all__`` and ``TYPE_CHECKING`` imports disagree."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def face_table(path: Path) -> dict[str, tuple[str, str]]:
    """The names a face's ``if TYPE_CHECKING:`` block imports.

    Args:
        path: the package's ``__init__.py``.

    Returns:
        Each public name (the alias where one is given) mapped to ``(module, attribute)``.
    """
    table: dict[str, tuple[str, str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                for alias in statement.names:
                    table[alias.asname or alias.name] = (statement.module, alias.name)
    return table


def attach(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a lazy face.

    Args:
        package: the package's ``__name__``.
        init_file: its ``__file__``.

    Returns:
        ``(__getattr__, __dir__)``: the first loads a public name's module, caches the name in the
        package's namespace and returns it; the second lists the public names.

    Raises:
        FaceError: at import, when ``__all__`` names something the imports do not, or the reverse,
            or a public name is also a submodule's.
    """
    table = face_table(Path(init_file))
    module = sys.modules[package]
    public = list(getattr(module, "__all__", ()))
    if set(public) != set(table):
        raise FaceError(f"{package}: __all__ and the TYPE_CHECKING imports differ by "
                        f"{sorted(set(public) ^ set(table))}; name each public name in both")
    here = Path(init_file).parent
    # Importing a submodule binds its name on the package, over a public name spelt the same.
    clashes = sorted(n for n in table if (here / f"{n}.py").exists() or (here / n).is_dir())
    if clashes:
        raise FaceError(f"{package}: public names {clashes} are also its submodules' names; "
                        "import those from the submodule")

    def __getattr__(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source, attribute = table[name]
        value = getattr(importlib.import_module(source), attribute)
        setattr(module, name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(public))

    return __getattr__, __dir__
