"""One-line errors at the CLI: a domain error prints ``error: …`` on stderr and exits 1 (2 for usage
and configuration); its traceback is printed too only with ``--debug`` or ``QPART_DEBUG=1``."""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import SecretBytes, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from qpart.client.errors import DeviceError
from qpart.flags import FlagValueError, env_name, json_example
from qpart.models.errors import ModelsError
from qpart.offline.errors import CalibrationConfigError, CalibrationError
from qpart.profiles.errors import ProfileError
from qpart.server.errors import ServerError

ERROR_EXIT = 1
USAGE_EXIT = 2
_SHOWN_INPUT = 60  # characters of a refused value quoted back


class UsageError(Exception):
    """A flag, argument or folder the command cannot use; the message says what to give (exit 2)."""


class CommandError(Exception):
    """A command could not do its job for a reason outside the package trees (exit 1)."""


@dataclass
class Mode:
    """Set by the ``qpart`` callback from ``--debug`` / ``QPART_DEBUG``."""

    debug: bool = False


MODE = Mode()


def run(app: Callable[[], Any]) -> None:
    """Run ``app``; an error a person can act on becomes one line and an exit status."""
    try:
        app()
    except Exception as exc:
        found = describe(exc)
        if found is None:  # a bug: its traceback is what a maintainer needs
            raise
        status, line = found
        if MODE.debug:
            traceback.print_exception(exc)
        sys.stderr.write(f"error: {line}\n")
        raise SystemExit(status) from None


def describe(exc: BaseException) -> tuple[int, str] | None:
    """Exit status and one line for a domain, usage or settings error; None for anything else."""
    settings = describe_settings_error(exc)
    if settings is not None:
        return USAGE_EXIT, settings
    usage, domain = _error_trees()
    if isinstance(exc, usage):
        return USAGE_EXIT, one_line(exc)
    if isinstance(exc, domain):
        return ERROR_EXIT, one_line(exc)
    return None


def _error_trees() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(usage errors, domain errors): the packages' exception trees. ``OSError`` covers unreadable
    files and PIL's ``UnidentifiedImageError`` (a subclass)."""
    from qpart.kernels.errors import KernelError  # noqa: PLC0415 (kernels/__init__ loads the kernels)

    usage = (UsageError, CalibrationConfigError, FlagValueError)
    return usage, (CommandError, KernelError, ModelsError, ProfileError, CalibrationError, DeviceError,
                   ServerError, OSError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (an OSError as ``file: reason``)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc)
    return " ".join(text.split()) or type(exc).__name__


def describe_settings_error(exc: BaseException) -> str | None:
    """One line naming each refused environment variable and what it accepts, for an error raised
    while building a settings class; None for other errors."""
    if isinstance(exc, ValidationError):
        cls = _settings_class(exc.title)
        if cls is None:
            return None
        return "; ".join(_refusal(cls, dict(error)) for error in exc.errors())
    if isinstance(exc, SettingsError):
        return _parse_failure(exc)
    return None


def _refusal(cls: type[BaseSettings], error: dict[str, Any]) -> str:
    """``QPART_PORT='abc': Input should be a valid integer…`` for one pydantic error."""
    msg = re.sub(r"^(Value error|Assertion failed), ", "", str(error["msg"]))
    loc = error.get("loc") or ()
    if not loc or str(loc[0]) not in cls.model_fields:
        return f"{cls.__name__}: {msg}"
    field = str(loc[0])
    item = "".join(f"[{part}]" for part in loc[1:])  # an element of a list or tuple setting
    value = "" if _is_secret(cls.model_fields[field].annotation) else _quoted(error.get("input"))
    return f"{env_name(cls, field)}{item}{value}: {msg}"


def _quoted(value: object) -> str:
    shown = repr(value)
    return "=" + (shown if len(shown) <= _SHOWN_INPUT else shown[:_SHOWN_INPUT] + "…")


def _is_secret(annotation: object) -> bool:
    """Whether a field's type holds a secret (its value is never quoted back)."""
    if isinstance(annotation, type) and issubclass(annotation, SecretStr | SecretBytes):
        return True
    return any(_is_secret(arg) for arg in get_args(annotation))


def _parse_failure(exc: SettingsError) -> str:
    """A variable pydantic-settings could not parse (a list or tuple setting takes JSON)."""
    field = re.search(r'field "(\w+)"', str(exc))
    cls = _source_class(exc)
    if field is None or cls is None or field.group(1) not in cls.model_fields:
        return one_line(exc)
    name = field.group(1)
    reason = f" ({one_line(exc.__cause__)})" if exc.__cause__ is not None else ""
    return (f"{env_name(cls, name)} cannot be parsed{reason}; it takes JSON, "
            f"e.g. its default {json_example(cls, name)}")


def _settings_class(title: str) -> type[BaseSettings] | None:
    """The loaded settings class a ValidationError's title names (pydantic titles by class name)."""
    todo: list[type[BaseSettings]] = list(BaseSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__name__ == title:
            return cls
        todo.extend(cls.__subclasses__())
    return None


def _source_class(exc: SettingsError) -> type[BaseSettings] | None:
    """The settings class whose source raised ``exc``: SettingsError names only the field, and the
    source that raised it (a frame of the traceback) knows its class."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, PydanticBaseSettingsSource):
            return owner.settings_cls
    return None
