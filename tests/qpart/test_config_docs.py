"""docs/configuration.md is generated from the settings classes: it must match them, and the render
must follow the classes (new fields, aliases) without machine-specific text."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import AliasChoices, Field, SecretStr, create_model

from qpart import config_docs
from qpart.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[2]


def test_document_matches_the_settings_classes():
    doc = REPO / "docs" / "configuration.md"
    assert doc.read_text(encoding="utf-8") == config_docs.render(), (
        "docs/configuration.md is out of date: run `make docs` (python -m qpart.config_docs)")


def test_every_settings_class_is_rendered():
    """A new BaseSettings subclass anywhere in the project must join SETTINGS."""
    found = set()
    tops = [d for d in REPO.iterdir() if d.is_dir() and not d.name.startswith(".")
            and d.name not in {"tests", "build"}]
    for path in (p for top in tops for p in top.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", None)) == "BaseSettings" for b in node.bases):
                found.add(node.name)
    assert found == {cls.__name__ for cls in config_docs.SETTINGS}


def test_a_field_added_to_a_settings_class_shows_up():
    copy = create_model(
        "ServerSettingsCopy", __base__=ServerSettings,
        new_knob=(int, Field(3, ge=1, description="A knob | with a pipe.")),
        renamed=(float, Field(0.5, validation_alias=AliasChoices("OTHER_NAME", "second_name"))),
        secret=(SecretStr, Field(SecretStr("hunter2"), description="Hidden.")),
    )
    text = config_docs.render_class(copy)
    assert "| `QPART_NEW_KNOB` | `int (≥ 1)` | `3` | A knob \\| with a pipe. |" in text
    assert "| `OTHER_NAME`, `SECOND_NAME` | `float` | `0.5` |" in text
    assert "| `QPART_SECRET` | `secret` | unset | Hidden. |" in text
    assert "hunter2" not in text
    assert text.count("\n| `") == len(ServerSettings.model_fields) + 3
    assert "QPART_NEW_KNOB" not in config_docs.render()


def test_render_is_the_same_on_every_machine():
    text = config_docs.render()
    assert str(Path.home()) not in text
    assert str(REPO) not in text
    assert "| `QPART_DEVICE_CACHE_DIR` | `path` | `~/.cache/qpart/segments` |" in text
    assert config_docs.show_path(REPO / "artifacts") == "artifacts"


def test_check_names_the_stale_file(tmp_path, capsys):
    doc = tmp_path / "configuration.md"
    assert config_docs.main(["--check", "--path", str(doc)]) == 1
    assert config_docs.main(["--path", str(doc)]) == 0
    assert config_docs.main(["--check", "--path", str(doc)]) == 0
    doc.write_text(doc.read_text(encoding="utf-8") + "edited\n", encoding="utf-8")
    capsys.readouterr()
    assert config_docs.main(["--check", "--path", str(doc)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(doc) in err


@pytest.mark.parametrize("name", ["port", "artifacts", "auth_token"])
def test_server_rows_give_prefix_type_and_default(name):
    field = ServerSettings.model_fields[name]
    assert config_docs.env_names(ServerSettings, name, field) == [f"QPART_{name.upper()}"]


@pytest.mark.parametrize("cls", config_docs.SETTINGS, ids=lambda c: c.__name__)
def test_every_setting_says_what_it_does(cls):
    assert [name for name, field in cls.model_fields.items() if not (field.description or "").strip()] == []


def test_advanced_settings_have_their_own_table_after_the_ones_a_user_sets():
    from qpart.flags import is_advanced
    from qpart.offline.settings import CalibrationSettings

    text = config_docs.render_class(CalibrationSettings)
    users, advanced = text.split("\n### Advanced\n")
    for name, field in CalibrationSettings.model_fields.items():
        row = f"| `QPART_CALIB_{name.upper()}` |"
        assert (row in advanced, row in users) == (is_advanced(field), not is_advanced(field)), name
    assert "QPART_CALIB_PROBES" in advanced and "QPART_CALIB_LEVELS" in users
    assert "### Advanced" not in config_docs.render_class(ServerSettings)  # none marked: one table


def test_a_field_marked_advanced_moves_to_the_advanced_table():
    copy = create_model("ServerSettingsCopy", __base__=ServerSettings, inner_knob=(int, Field(
        3, json_schema_extra={"advanced": True}, description="An internal.")))
    users, advanced = config_docs.render_class(copy).split("\n### Advanced\n")
    assert "QPART_INNER_KNOB" in advanced and "QPART_INNER_KNOB" not in users
    assert "QPART_PORT" in users and "QPART_PORT" not in advanced
