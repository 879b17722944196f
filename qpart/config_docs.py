"""Renders docs/configuration.md from the project's pydantic-settings classes, so the document cannot
drift from the code: ``python -m qpart.config_docs`` writes it, ``--check`` exits 1 when it differs."""

from __future__ import annotations

import argparse
import enum
import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import AliasChoices, AliasPath, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from qpart.client.settings import DeviceSettings
from qpart.flags import is_advanced
from qpart.kernels.ops import BACKEND_ENV, ISA_ENV, Backend
from qpart.models.data import DATA_DIR_ENV, DEFAULT_DATA_DIR
from qpart.models.registry import REGISTRY_ENV
from qpart.offline.settings import CalibrationSettings
from qpart.server.settings import ServerSettings

SETTINGS: tuple[type[BaseSettings], ...] = (ServerSettings, DeviceSettings, CalibrationSettings)
"""Every ``BaseSettings`` subclass of the project, in the document's order."""

READERS: dict[type[BaseSettings], str] = {
    ServerSettings: "`qpart serve`",
    DeviceSettings: "`qpart device …` and `client.runtime.DeviceRuntime`",
    CalibrationSettings: "`qpart calibrate` and the calibration image",
}

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"

HEADER = """# Configuration

Generated from the settings classes by `python -m qpart.config_docs` (`make docs`); do not edit by
hand. Environment variables are matched case-insensitively; list values are JSON
(`QPART_CALIB_LEVELS='[0.005, 0.01]'`), booleans `true`/`false` (or `1`/`0`). Environment says how
to run; artifact files say what the model is.
"""

_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"),
           ("max_length", "length ≤"))
_NAMES: dict[type, str] = {str: "str", int: "int", float: "float", bool: "bool", Path: "path",
                           SecretStr: "secret"}


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The variables that set ``field``: the prefix plus the field name, or its alias(es) as is
    (pydantic-settings applies no prefix to an alias)."""
    alias = field.validation_alias or field.alias
    if alias is None:
        return [(str(cls.model_config.get("env_prefix", "")) + name).upper()]
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    return [(c if isinstance(c, str) else str(c.path[0])).upper() for c in choices
            if isinstance(c, str | AliasPath)]


def type_name(annotation: Any) -> str:
    """A short, stable name of a field's type; ``None`` is left out (the default says "unset")."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args if a is not type(None))
    if origin in (tuple, list, set, frozenset):
        return f"list of {type_name(args[0])}" if args else "list"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    if isinstance(annotation, type):
        return _NAMES.get(annotation, annotation.__name__)
    return str(annotation)


def bounds(field: FieldInfo) -> str:
    """The field's numeric and length constraints, e.g. ``≥ 0, ≤ 65535``."""
    found = [f"{sign} {getattr(m, attr)}" for m in field.metadata for attr, sign in _BOUNDS
             if getattr(m, attr, None) is not None]
    return ", ".join(found)


def _plain(value: Any) -> Any:
    """``value`` as JSON would carry it (enums by value, tuples as lists)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list | set | frozenset):
        return [_plain(v) for v in value]
    return value


def show_path(path: Path) -> str:
    """A path as the same on every machine: relative, or from ``~`` when under the home folder."""
    if not path.is_absolute():
        return path.as_posix()
    for base, shown in ((ROOT, ""), (Path.home(), "~/")):
        if path.is_relative_to(base):
            return shown + path.relative_to(base).as_posix()
    return path.as_posix()


def default_text(field: FieldInfo) -> str:
    """The default as a user would write it in the environment; secrets and ``None`` as unset."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True, validated_data={})
    if value is None or isinstance(value, SecretStr):
        return "unset"
    if isinstance(value, Path):
        return f"`{show_path(value)}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(_plain(value))}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


ADVANCED_NOTE = ("Internals of the method, for tuning it rather than running it (fields marked "
                 "`advanced`); the table above is what a user sets.")


def render_class(cls: type[BaseSettings]) -> str:
    """One section: a heading, who reads the class, a table of its variables, and, if the class marks
    any field advanced (:func:`qpart.flags.is_advanced`), a second table of those."""
    doc = (cls.__doc__ or "").strip().splitlines()
    lines = [f"## {cls.__name__}", "",
             f"`{cls.__module__}.{cls.__name__}`{': ' + doc[0] if doc else ''} "
             f"Read by {READERS.get(cls, f'`{cls.__module__}`')}.", ""]
    advanced = [name for name, field in cls.model_fields.items() if is_advanced(field)]
    lines += _table(cls, [name for name in cls.model_fields if name not in advanced])
    if advanced:
        lines += ["", "### Advanced", "", ADVANCED_NOTE, "", *_table(cls, advanced)]
    return "\n".join(lines) + "\n"


def _table(cls: type[BaseSettings], names: Sequence[str]) -> list[str]:
    """The table rows of ``cls``'s fields ``names``, with its header."""
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name in names:
        field = cls.model_fields[name]
        kind = type_name(field.annotation)
        if limits := bounds(field):
            kind += f" ({limits})"
        variable = ", ".join(f"`{v}`" for v in env_names(cls, name, field))
        row = [variable, f"`{kind}`", default_text(field), field.description or ""]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def render_other() -> str:
    """Variables read outside the settings classes, from the constants that name them."""
    kernels = " | ".join(json.dumps(v) for v in ("auto", *(b.value for b in Backend)))
    rows = [
        (BACKEND_ENV, kernels, "`auto`", "Kernel implementation: the C extension, the numpy "
         "reference, or auto (the extension when built, else numpy with a warning)."),
        (ISA_ENV, '"auto" | "x86-64-v4" | "x86-64-v3" | "baseline"', "`auto`",
         "Instruction-set level of the C extension's loops: auto, the widest this CPU runs; another "
         "level this CPU runs (every level gives the same bytes); an unknown one is an error."),
        (DATA_DIR_ENV, "path", f"`{show_path(DEFAULT_DATA_DIR)}`",
         "Folder holding Fashion-MNIST (Debian package `dataset-fashion-mnist`)."),
        (REGISTRY_ENV, "path", "unset", "Registry file of your own models (`qpart models register`)."),
        ("QPART_DEVICE_UPLOAD_DEFLATE", "bool", "unset", "Deprecated: `false` means "
         "`QPART_DEVICE_UPLOAD_CODINGS='[]'`, `true` `'[\"deflate\"]'`; ignored (with a warning) "
         "when that is set."),
    ]
    lines = ["## Other variables", "", "| variable | type | default | description |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(c) for c in (f"`{v}`", f"`{t}`", d, text)) + " |"
              for v, t, d, text in rows]
    return "\n".join(lines) + "\n"


def render(classes: Sequence[type[BaseSettings]] = SETTINGS) -> str:
    """The whole document."""
    return "\n".join([HEADER, *(render_class(c) for c in classes), render_other()])


def main(argv: Sequence[str] | None = None) -> int:
    """Write the document, or with ``--check`` return 1 when it is out of date."""
    parser = argparse.ArgumentParser(prog="python -m qpart.config_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="Exit 1 when the file is out of date.")
    parser.add_argument("--path", type=Path, default=DOC, help="The document (default: %(default)s).")
    args = parser.parse_args(argv)
    text, path = render(), args.path
    if args.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is missing or out of date with the settings classes: run `make docs`",
                  file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
