"""The cut choice (ADR 0025): each cut's predicted patterns priced over the envelope; a cut no plan
comes near is pruned with its reason, cut 0 is always kept, runtimes that refuse a cut are priced
without it, and a named cut the model does not have is refused in one line."""

from __future__ import annotations

import math

import pytest

from qpart.offline.errors import CalibrationConfigError
from qpart.offline.pruning import Offer, check_named_cuts, choose_cuts, closest, envelope
from qpart.offline.settings import CalibrationSettings
from qpart.profiles import load_artifact
from qpart.profiles.devices import builtin_devices

LEVELS = (0.01, 0.02)


@pytest.fixture(scope="module")
def cuts(artifacts_dir):
    """fmnist-cnn's nine cuts: their FLOPs, sizes and runtime refusals."""
    return load_artifact(artifacts_dir / "fmnist-cnn").cuts


def _settings(**changes):
    return CalibrationSettings(levels=LEVELS, **changes)


def _offers(cuts, activation, weights):
    """Per cut, the same bytes at every level and lossless (``activation[i]``, ``weights[i]``)."""
    return [Offer(c.index, level, weights[c.index], activation[c.index])
            for c in cuts for level in (0.0, *LEVELS)]


def test_a_cut_that_sends_no_fewer_bytes_than_an_earlier_one_after_more_work_is_pruned(cuts):
    # cut 2 uploads what cut 1 does, downloads more and computes more: never the best anywhere
    activation = [3136, 400, 400, 300, 300, 200, 200, 100, 0]
    weights = [0, 1000, 5000, 6000, 7000, 8000, 9000, 10000, 20000]
    choice = choose_cuts(_offers(cuts, activation, weights), cuts, _settings())
    assert choice.mode == "envelope" and 0 in choice.calibrated and 2 not in choice.calibrated
    assert choice.closest["2"] > 1.02
    assert choice.pruned["2"].startswith(f"at best {choice.closest['2']:.3g}x the best plan's objective (")
    assert "the margin is 1.02x" in choice.pruned["2"]
    assert sorted(map(int, choice.pruned)) == [c.index for c in cuts if c.index not in choice.calibrated]
    # each kept cut (but cut 0, kept always) is the best, or within the margin, somewhere
    assert all(choice.closest[str(c)] <= 1.02 for c in choice.calibrated if c)
    assert choice.envelope is not None and choice.envelope["margin"] == 0.02


def test_a_wider_margin_keeps_every_cut_within_it(cuts):
    activation = [3136, 400, 400, 300, 300, 200, 200, 100, 0]
    weights = [0, 1000, 5000, 6000, 7000, 8000, 9000, 10000, 20000]
    offers = _offers(cuts, activation, weights)
    near = choose_cuts(offers, cuts, _settings()).closest
    wide = choose_cuts(offers, cuts, _settings(envelope_margin=0.5))
    assert wide.calibrated == sorted({0} | {int(c) for c, r in near.items() if r <= 1.5})
    assert len(wide.calibrated) > len(choose_cuts(offers, cuts, _settings()).calibrated)


def test_cut_0_is_kept_even_where_no_plan_would_choose_it(cuts):
    activation = [10**9, 400, 400, 300, 300, 200, 200, 100, 0]  # a huge input: cut 0 never pays
    choice = choose_cuts(_offers(cuts, activation, [0] * 9), cuts, _settings())
    assert choice.calibrated[0] == 0 and choice.closest["0"] > 100


def test_a_cut_a_runtime_refuses_is_priced_without_it_for_that_runtime(cuts):
    activation = [3136, 400, 400, 300, 300, 200, 200, 100, 0]
    weights = [0, 1000, 5000, 6000, 7000, 8000, 9000, 10000, 20000]
    offers = _offers(cuts, activation, weights)
    plain = closest(offers, cuts, LEVELS, _settings())
    # onnx refuses every cut but 0 and 2: for onnx devices cut 2 is then the best somewhere
    refused = [c.model_copy(update={"runtimes_refused": {"onnx": "no"}}) if c.index not in (0, 2) else c
               for c in cuts]
    with_refusals = closest(offers, refused, LEVELS, _settings())
    assert plain[2][0] > 1.02 and with_refusals[2][0] == pytest.approx(1.0)
    assert {c: r for c, (r, _) in with_refusals.items() if c != 2} == {c: r for c, (r, _) in plain.items()
                                                                       if c != 2}


def test_the_envelope_prices_every_combination_of_its_settings():
    s = _settings(envelope_speeds=(1.0, 2.0), envelope_rate_points=3, envelope_server_flops=(1e9, 1e10))
    requests = list(envelope(s))
    assert len(requests) == len(builtin_devices()) * 2 * 3 * 4 * 2 * 2  # devices, speeds, rates, objectives,
    rates = sorted({r.inputs.rate_bps for r in requests})  # servers, segments held or not
    assert rates == pytest.approx([1e5, 1e5 * math.sqrt(1e4), 1e9])
    only = list(envelope(_settings(envelope_devices=("phone-soc",))))
    assert {r.inputs.device.name for r in only} == {"phone-soc"}
    with pytest.raises(ValueError, match="envelope_devices names watch, not a shipped device"):
        _settings(envelope_devices=("watch",))


def test_all_and_named_cuts_are_taken_as_given_with_cut_0(cuts):
    assert choose_cuts([], cuts, _settings(cuts="all")).calibrated == list(range(9))
    named = choose_cuts([], cuts, _settings(cuts="3,5"))
    assert named.mode == "named" and named.calibrated == [0, 3, 5]
    assert named.pruned["4"] == "not named by --cuts" and "0" not in named.pruned


def test_a_named_cut_the_model_lacks_is_one_line_naming_the_legal_ones():
    with pytest.raises(CalibrationConfigError) as err:
        check_named_cuts((0, 9, 12), 9)
    message = str(err.value)
    assert "--cuts names cut 9, 12, which this model does not have: its cuts are 0 to 8" in message
    assert "\n" not in message
    check_named_cuts((0, 8), 9)  # every one there: nothing to say


@pytest.mark.parametrize(("given", "error"), [("x", "give auto, all, or cut indices"),
                                              ("", "give auto, all, or cut indices"),
                                              ("1,,2", "give auto, all, or cut indices")])
def test_cuts_that_are_not_a_selection_are_refused(given, error):
    with pytest.raises(ValueError, match=error):
        CalibrationSettings(cuts=given)


@pytest.mark.parametrize(("changes", "error"), [
    ({"envelope_price": math.inf}, "finite number"),
    ({"envelope_speeds": (1.0, math.nan)}, "finite number"),
    ({"envelope_server_flops": (math.inf,)}, "finite number"),
    ({"envelope_rates_mbps": (10.0, 1.0)}, "two positive rates, lowest first"),
    ({"envelope_rate_points": 1}, "envelope_rate_points 1 prices one rate, but envelope_rates_mbps spans"),
    ({"cuts": "[0,4"}, "give auto, all, or cut indices"),
])
def test_an_envelope_that_would_price_nothing_is_refused(changes, error):
    # an infinite price made every ratio NaN, and every cut but 0 pruned with a false reason
    with pytest.raises(ValueError, match=error):
        CalibrationSettings(**changes)


def test_cuts_take_json_lists_and_keywords_in_any_case():
    assert CalibrationSettings(cuts="[0, 4, 8]").cuts == (0, 4, 8)
    assert CalibrationSettings(cuts=" ALL ").cuts == "all" and CalibrationSettings(cuts="Auto").cuts == "auto"
    one = CalibrationSettings(envelope_rate_points=1, envelope_rates_mbps=(5.0, 5.0))
    assert one.envelope_rate_points == 1
