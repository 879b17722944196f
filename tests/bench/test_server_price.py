"""bench.e2e.analyses.server_price: a grid's cut-0 server time against its price."""

from __future__ import annotations

import json

import pytest

from bench.e2e.analyses.server_price import main, overrun_ms, parts_ms, price_error_by_rate_ms


def _cell(model, rate, cache, predicted, measured, cut=0, parts=True):
    s = {"cut": cut, "predicted_server_s": predicted, "measured_server_s": measured}
    if parts:
        s.update(measured_queue_s=3e-5, measured_compute_s=measured - 3e-5, measured_decode_s=2e-4)
    return {"model": model, "rate_mbps": rate, "cache": cache,
            "strategies": {"all-server": s, "all-device": {"cut": 4, "predicted_server_s": 0.0,
                                                           "measured_server_s": 0.0}}}


def test_the_overrun_parts_and_price_error_by_rate(tmp_path):
    cells = [_cell("m", 1.0, "cold", 1.0e-3, 1.0e-3), _cell("m", 100.0, "cold", 1.0e-3, 1.6e-3),
             _cell("m", 100.0, "warm", 1.0e-3, 1.2e-3), _cell("n", 5.0, "cold", 2e-3, 1e-3, parts=False)]
    over = overrun_ms(cells)
    assert over["m"] == {"all-server": pytest.approx(0.2)} and over["n"]["all-server"] == pytest.approx(-1.0)
    assert "all-device" not in over["m"]  # no server time at the last cut
    parts = parts_ms(cells)
    assert parts["m"]["all-server"] == pytest.approx({"queue": 0.03, "compute": 1.17, "decode": 0.2})
    assert "n" not in parts  # an older grid's cells keep no parts
    by_rate = price_error_by_rate_ms(cells)
    assert by_rate == {"m": {"1": pytest.approx(0.0), "100": pytest.approx(-0.6)},
                       "n": {"5": pytest.approx(1.0)}}
    assert price_error_by_rate_ms(cells, cache="warm") == {"m": {"100": pytest.approx(-0.2)}}
    grid, out = tmp_path / "grid.json", tmp_path / "out.json"
    grid.write_text(json.dumps({"cells": cells, "provenance": {"commit": "abc"}}))
    main([str(grid), "--json", str(out)])
    written = json.loads(out.read_text())
    assert written["price_error_by_rate_ms"]["m"]["100"] == pytest.approx(-0.6)
    assert written["grid_provenance"] == {"commit": "abc"} and "commit" in written["provenance"]
