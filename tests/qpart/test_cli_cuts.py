"""``qpart calibrate --cuts`` (issue 51): a cut the model does not have, or a selection that is not
one, is one line saying what to give, with nothing written to ``--out``."""

from __future__ import annotations

import pytest

from tests.qpart.test_cli_errors import one_line_error, qpart


@pytest.mark.parametrize(("given", "status", "says"), [
    ("0,9,12", 2, "--cuts names cut 9, 12, which this model does not have: its cuts are 0 to 8"),
    ("seven", 2, "give auto, all, or cut indices separated by commas, e.g. 0,7,12"),
])
def test_cuts_that_cannot_be_calibrated_are_one_line_and_write_nothing(tmp_path, given, status, says):
    out = tmp_path / "out"
    line = one_line_error(qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), "--cuts", given,
                                cwd=tmp_path), status)
    assert says in line
    assert not out.exists()


def test_an_envelope_device_that_is_not_shipped_is_one_line(tmp_path):
    out = tmp_path / "out"
    line = one_line_error(qpart("calibrate", "--model", "fmnist-cnn", "--out", str(out), "--envelope-devices",
                                "phone-soc,watch", cwd=tmp_path), 2)
    assert "envelope_devices names watch, not a shipped device profile; known: jetson-nano" in line
    assert not out.exists()


def test_help_explains_the_cut_choice(tmp_path):
    shown = qpart("calibrate", "--help", cwd=tmp_path).stdout
    assert "--cuts" in shown and "auto, the cuts a plan could choose" in shown
    assert "--envelope-margin" in shown and "--no-baseline" in shown
