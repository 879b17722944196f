"""Settings that take effect: for ``serve`` and ``calibrate`` a flag overrides the environment and
the environment overrides the default; the job and the server are replaced by seams that keep the
settings object the command built."""

from __future__ import annotations

import os
import sys
from types import ModuleType, SimpleNamespace

import pytest
from typer.testing import CliRunner

from qpart.cli import app
from qpart.flags import env_help, settings_from
from qpart.offline.settings import CalibrationSettings, Estimator
from qpart.server.settings import ServerSettings


@pytest.fixture
def seen(monkeypatch) -> list[object]:
    """Every settings object handed to the server or the calibration job."""
    for name in [k for k in os.environ if k.startswith("QPART_")]:
        monkeypatch.delenv(name)
    captured: list[object] = []
    server_main = ModuleType("qpart.server.api.main")
    server_main.serve = captured.append  # type: ignore[attr-defined]
    job = ModuleType("qpart.offline.job")

    def calibrate(spec, settings, out, sink, *, fresh, executor):
        assert (fresh, executor) == (False, None)  # the defaults: resume, in local processes
        captured.append(settings)
        return SimpleNamespace(patterns=[], lossless_levels=[], calibrated_cuts=[0], cuts=[None],
                               cut_choice=None)

    job.calibrate = calibrate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qpart.server.api.main", server_main)
    monkeypatch.setitem(sys.modules, "qpart.offline.job", job)
    return captured


def invoke(args: list[str], env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, (result.output, result.exception)


@pytest.fixture
def artifacts(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "artifact.json").write_text("{}")  # serve only checks that there is one
    return tmp_path


def test_serve_reads_the_environment_and_a_flag_overrides_it(seen, artifacts, tmp_path):
    env = {"QPART_PORT": "8123", "QPART_HOST": "0.0.0.0", "QPART_ARTIFACTS": str(artifacts),
           "QPART_MAX_QUEUE": "17"}
    invoke(["serve"], env)
    invoke(["serve", "--port", "8124", "--host", "127.0.0.2"], env)
    from_env, flagged = seen
    assert isinstance(from_env, ServerSettings) and isinstance(flagged, ServerSettings)
    assert (from_env.port, from_env.host, from_env.artifacts, from_env.max_queue) == (
        8123, "0.0.0.0", artifacts, 17)
    assert (flagged.port, flagged.host, flagged.artifacts, flagged.max_queue) == (
        8124, "127.0.0.2", artifacts, 17)
    assert from_env.max_batch_size == ServerSettings.model_fields["max_batch_size"].default


def test_calibrate_reads_the_environment_and_a_flag_overrides_it(seen, tmp_path):
    env = {"QPART_CALIB_FIT_SAMPLES": "123", "QPART_CALIB_LEVELS": "[0.02, 0.01]",
           "QPART_CALIB_ESTIMATOR": "direct", "QPART_CALIB_BASELINE": "false", "QPART_CALIB_PROBES": "3"}
    out = ["--model", "fmnist-cnn", "--out", str(tmp_path / "out")]
    invoke(["calibrate", *out], env)
    invoke(["calibrate", *out, "--fit-samples", "321", "--levels", "0.005", "--estimator", "fast",
            "--baseline"], env)
    from_env, flagged = seen
    assert isinstance(from_env, CalibrationSettings) and isinstance(flagged, CalibrationSettings)
    assert (from_env.fit_samples, from_env.levels, from_env.estimator, from_env.baseline) == (
        123, (0.01, 0.02), Estimator.DIRECT, False)
    assert (flagged.fit_samples, flagged.levels, flagged.estimator, flagged.baseline) == (
        321, (0.005,), Estimator.FAST, True)
    assert from_env.probes == flagged.probes == 3  # no flag: the environment
    assert from_env.check_samples is None  # neither: from the data's size, when the job opens it


def test_confidence_sets_delta_in_the_settings_and_in_the_artifacts_promise(seen, tmp_path):
    from qpart.offline.ltt import make_promise

    out = ["--model", "fmnist-cnn", "--out", str(tmp_path / "out")]
    invoke(["calibrate", *out], {})
    invoke(["calibrate", *out], {"QPART_CALIB_CONFIDENCE": "0.99"})
    invoke(["calibrate", *out, "--confidence", "0.9"], {"QPART_CALIB_CONFIDENCE": "0.99"})
    default, from_env, flagged = seen
    assert isinstance(default, CalibrationSettings) and isinstance(flagged, CalibrationSettings)
    assert [s.delta for s in (default, from_env, flagged)] == [0.05, 0.01, 0.1]
    for settings, shown in ((default, "δ = 0.05;"), (from_env, "δ = 0.01;"), (flagged, "δ = 0.1;")):
        promise = make_promise(settings.model_copy(update={"check_samples": 6000}))  # as the job resolves it
        assert promise.delta == settings.delta and shown in promise.statement


def test_settings_from_passes_only_the_flags_given(monkeypatch):
    monkeypatch.setenv("QPART_CALIB_SEED", "7")
    assert settings_from(CalibrationSettings, {"seed": None}).seed == 7
    assert settings_from(CalibrationSettings, {"seed": 8}).seed == 8


def test_a_refused_flag_is_named_as_typed_and_a_refused_variable_as_set(monkeypatch):
    from pydantic import ValidationError

    from qpart.errors import describe
    from qpart.flags import FlagValueError

    with pytest.raises(FlagValueError) as err:
        settings_from(CalibrationSettings, {"check_samples": 50, "levels": (5.0,)})
    assert str(err.value) == ("--levels 5.0: levels must be fractions in (0, 1), e.g. 0.01 for 1%; "
                              "--check-samples 50: Input should be greater than or equal to 100")
    assert describe(err.value) == (2, str(err.value))  # a usage error: one line, exit 2
    monkeypatch.setenv("QPART_CALIB_CHECK_SAMPLES", "50")
    with pytest.raises(ValidationError) as env_err:
        settings_from(CalibrationSettings, {"seed": 1})
    assert describe(env_err.value) == (
        2, "QPART_CALIB_CHECK_SAMPLES='50': Input should be greater than or equal to 100")


def test_help_shows_the_default_and_the_variable():
    assert env_help(CalibrationSettings, "fit_samples") == (
        "Calibration samples for tables and mapping; none: from the data's size (4000 from 10,000 samples "
        "up, else 40%: offline.sizing) (default: none, env QPART_CALIB_FIT_SAMPLES)")
    assert "default: 0.001,0.0025,0.005,0.01,0.02, env QPART_CALIB_LEVELS" in env_help(
        CalibrationSettings, "levels")
    assert "default: 8000, env QPART_PORT" in env_help(ServerSettings, "port")


def _calibrate_options() -> dict[str, object]:
    import typer

    command = typer.main.get_command(app).commands["calibrate"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_calibrate_shows_the_advanced_settings_in_their_own_help_panel():
    from qpart.cli_calibrate import ADVANCED_PANEL
    from qpart.flags import is_advanced

    fields = CalibrationSettings.model_fields
    options = _calibrate_options()
    advanced = {name for name, field in fields.items() if is_advanced(field)}
    assert {name for name, o in options.items() if o.rich_help_panel == ADVANCED_PANEL} == advanced
    assert advanced and advanced <= set(options)
    shown = CliRunner().invoke(app, ["calibrate", "--help"], env={"COLUMNS": "200"}).output
    assert "Advanced" in shown and shown.index("--fit-samples") < shown.index("Advanced") < shown.index(
        "--search-octaves")


def test_each_calibrate_option_named_as_a_setting_sets_it(seen, tmp_path):
    out = ["--model", "fmnist-cnn", "--out", str(tmp_path / "out")]
    invoke(["calibrate", *out, "--probes", "5", "--ladder=-2,0,1", "--spill-above-mb", "0",
            "--mapping-points", "41", "--bound", "newcombe", "--no-measure-both", "--split-seed", "3"], {})
    (settings,) = seen
    assert isinstance(settings, CalibrationSettings)
    assert (settings.probes, settings.ladder, settings.spill_above_mb, settings.mapping_points,
            settings.bound, settings.measure_both, settings.split_seed) == (5, (-2, 0, 1), 0, 41, "newcombe",
                                                                            False, 3)
    # and an option not given leaves the setting to the environment and the default
    assert settings.budget_units == CalibrationSettings.model_fields["budget_units"].default
