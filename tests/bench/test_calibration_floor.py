"""bench.micro.calibration_floor counts each lossy pattern measured on the test split once."""

from __future__ import annotations

from bench.micro.calibration_floor import lossy_patterns


def pattern(cut: int, bits: dict[str, int], act: int, test_drop: float | None = 0.0) -> dict[str, object]:
    return {"cut": cut, "weight_bits": bits, "activation_bits": act, "test_drop": test_drop}


def test_lossless_untested_and_repeated_patterns_are_left_out():
    doc = {"patterns": [pattern(1, {"a": 32}, 32), pattern(1, {"a": 4}, 8), pattern(2, {"a": 4}, 8),
                        pattern(1, {"a": 4}, 8, None)],
           "baseline_qpart_paper": [pattern(1, {"a": 4}, 8), pattern(1, {"a": 32}, 6)]}
    assert lossy_patterns(doc) == [(1, {"a": 4}, 8), (2, {"a": 4}, 8), (1, {"a": 32}, 6)]
