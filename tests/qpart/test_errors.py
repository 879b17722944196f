"""How errors become one line: any settings class's refused values name their variable (never a
secret's value), domain errors keep their message, and a bug keeps its traceback."""

from __future__ import annotations

import pytest
from PIL import UnidentifiedImageError
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from qpart.errors import ERROR_EXIT, USAGE_EXIT, UsageError, describe, run
from qpart.models.errors import ModelLoadError


class TokenSettings(BaseSettings):
    """Like the server's: a token that must not be blank, and a bounded list."""

    model_config = SettingsConfigDict(env_prefix="QPART_TEST_")

    auth_token: SecretStr | None = None
    sizes: tuple[int, ...] = Field((1, 2), description="Some sizes.")
    workers: int = Field(1, ge=1, le=4)

    @field_validator("auth_token")
    @classmethod
    def _not_blank(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("the token is empty or blank; unset it or give a token")
        return token


def refused(**env: str) -> tuple[int, str] | None:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            TokenSettings()
        except (ValidationError, SettingsError) as exc:
            return describe(exc)
    raise AssertionError("the settings were accepted")


def test_a_refused_secret_names_its_variable_and_never_its_value():
    assert refused(QPART_TEST_AUTH_TOKEN="   \n ") == (
        USAGE_EXIT, "QPART_TEST_AUTH_TOKEN: the token is empty or blank; unset it or give a token")


def test_every_refused_value_is_named_on_one_line():
    status, line = refused(QPART_TEST_WORKERS="9", QPART_TEST_SIZES='[1, "x"]') or (0, "")
    assert status == USAGE_EXIT and "\n" not in line
    assert "QPART_TEST_WORKERS='9': Input should be less than or equal to 4" in line
    assert "QPART_TEST_SIZES[1]='x': Input should be a valid integer" in line


def test_a_value_that_is_not_json_says_the_variable_takes_json():
    status, line = refused(QPART_TEST_SIZES="1,2") or (0, "")
    assert status == USAGE_EXIT
    assert line.startswith("QPART_TEST_SIZES cannot be parsed") and line.endswith("e.g. its default [1, 2]")


@pytest.mark.parametrize(("exc", "expected"), [
    (ModelLoadError("cannot load 'm' from w:\n\tMissing key(s)"),
     (ERROR_EXIT, "cannot load 'm' from w: Missing key(s)")),
    (UsageError("give --registry FILE"), (USAGE_EXIT, "give --registry FILE")),
    (FileNotFoundError(2, "No such file or directory", "/x/y"),
     (ERROR_EXIT, "/x/y: No such file or directory")),
    (UnidentifiedImageError("cannot identify image file 'a.png'"),
     (ERROR_EXIT, "cannot identify image file 'a.png'")),
])
def test_domain_errors_keep_their_message_on_one_line(exc, expected):
    assert describe(exc) == expected


def test_a_bug_keeps_its_traceback():
    def broken() -> None:
        raise KeyError("a bug")

    assert describe(KeyError("a bug")) is None
    with pytest.raises(KeyError):
        run(broken)


def test_a_domain_error_exits_with_its_status(capsys):
    def failing() -> None:
        raise UsageError("give --registry FILE")

    with pytest.raises(SystemExit) as stop:
        run(failing)
    assert stop.value.code == USAGE_EXIT
    assert capsys.readouterr().err == "error: give --registry FILE\n"
