"""Flags over the environment over the defaults: CLI options default to None and only the flags a
user gave reach a settings class (pydantic-settings ranks keyword arguments above the environment)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def settings_from(cls: type[S], flags: Mapping[str, object]) -> S:
    """``cls`` built from the environment, with the flags that were given (not None) on top.

    Raises:
        ValueError: a flag's value refused, in one line naming the flag as it was typed
            (``--check-samples 50: Input should be greater than or equal to 100``); a refused
            environment variable raises pydantic's ValidationError, which the CLI names by variable.
    """
    given: dict[str, Any] = {name: value for name, value in flags.items() if value is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        typed = [e for e in exc.errors() if e.get("loc") and str(e["loc"][0]) in given]
        if not typed:
            raise
        raise FlagValueError("; ".join(
            f"--{str(e['loc'][0]).replace('_', '-')} {_shown(given[str(e['loc'][0])])}: "
            + re.sub(r"^(Value error|Assertion failed), ", "", str(e["msg"]))
            for e in typed)) from exc


class FlagValueError(ValueError):
    """A command-line flag whose value its settings class refuses (a usage error)."""


def _shown(value: object) -> str:
    """A flag's value as a person typed it (a tuple as comma-separated items)."""
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def is_advanced(field: FieldInfo) -> bool:
    """Whether a settings field is one of its process's internals (``json_schema_extra={"advanced":
    True}``, e.g. :data:`qpart.offline.settings.ADVANCED`), shown apart from what a user sets."""
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("advanced") is True


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` of ``cls``."""
    alias = cls.model_fields[field].validation_alias
    if isinstance(alias, str):
        return alias.upper()
    return (str(cls.model_config.get("env_prefix", "")) + field).upper()


def env_help(cls: type[BaseSettings], field: str, text: str | None = None) -> str:
    """Help text of the option for ``field``: what it does (its description unless ``text``), its
    default and the variable it overrides, e.g. ``… (default: 4000, env QPART_CALIB_FIT_SAMPLES)``."""
    info = cls.model_fields[field]
    what = (text or info.description or field.replace("_", " ")).rstrip(".")
    return f"{what} (default: {shown_default(info.default)}, env {env_name(cls, field)})"


def shown_default(value: object) -> str:
    """A default as a user would type it as a flag: tuples comma-separated, enums by value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return ",".join(shown_default(v) for v in value)
    return str(value)


def json_example(cls: type[BaseSettings], field: str) -> str:
    """The default of ``field`` as the JSON its environment variable takes (lists, tuples, None)."""
    return json.dumps(to_jsonable_python(cls.model_fields[field].default))
