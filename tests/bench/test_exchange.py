"""bench.exchange: from probes of a link to the rtt and upload overlap a plan request carries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.exchange import ExchangeProbe, fit_exchange, probe_medians


def _link(base, other, pre_body, body_small, body_large):
    """Rests of a link whose server starts ``pre_body`` of work on the headers, as the model
    assumes: the exchange's rest is base + other wire time + max(body, pre-body work)."""
    return (base + other + max(body_small, pre_body), base + other + max(body_large, pre_body))


def test_medians_pair_the_exchanges():
    p = probe_medians([2.0, 3.0, 4.0], [2.5, 3.1, 4.6], small_body_s=0.5, large_body_s=1.5)
    assert p.small_rest_s == 3.0 and p.extra_wire_s == 1.0 and p.small_body_s == 0.5
    assert p.hidden_s == pytest.approx(0.5)  # median of 0.5, 0.9, 0.4
    with pytest.raises(ValueError):
        probe_medians([1.0], [1.0, 2.0], 0.5, 1.5)
    with pytest.raises(ValueError):
        fit_exchange([], lambda o: 0.0)


@given(base=st.floats(0.0005, 0.005), pre_body=st.floats(0.0, 0.002), body_small=st.floats(0.0, 0.003),
       extra=st.floats(0.0001, 0.05))
def test_the_fit_reproduces_both_exchanges_of_a_link_whose_server_starts_on_the_headers(
        base, pre_body, body_small, extra):
    other = 0.0003
    small, large = _link(base, other, pre_body, body_small, body_small + extra)
    probe = probe_medians([small], [large], body_small, body_small + extra)

    def transfer(overlap, body=body_small):
        return other + max(0.0, body - overlap)

    rtt, overlap = fit_exchange([probe], transfer)
    if pre_body > body_small + 1e-9:  # the work outlasted the small body: it is measured
        assert overlap == pytest.approx(min(pre_body, body_small + extra), abs=1e-9)
    else:  # none was hidden: 0, or (rounding made the hidden part positive) at most the small body
        assert overlap <= body_small + 1e-9
    assert rtt + transfer(overlap) == pytest.approx(small, abs=1e-9)  # the small exchange, reproduced
    assert rtt + transfer(overlap, body_small + extra) == pytest.approx(large, abs=1e-9)  # the large one


def test_no_hidden_time_and_noise_give_no_overlap_and_never_a_negative_rtt():
    probe = ExchangeProbe(small_rest_s=0.001, hidden_s=-0.0003, extra_wire_s=0.002, small_body_s=0.0005)
    rtt, overlap = fit_exchange([probe], lambda o: 0.004)  # priced above what was measured
    assert (rtt, overlap) == (0.0, 0.0)
    whole = ExchangeProbe(small_rest_s=0.003, hidden_s=0.01, extra_wire_s=0.002, small_body_s=0.0005)
    assert fit_exchange([whole], lambda o: 0.001)[1] == 0.0025  # at most the large body's wire time


def test_the_window_takes_medians_so_one_odd_probe_does_not_move_the_plan():
    usual = ExchangeProbe(0.0021, 0.0002, 0.0003, 0.00003)
    odd = ExchangeProbe(0.0040, -0.001, 0.0003, 0.00003)
    rtt, overlap = fit_exchange([usual, odd, usual], lambda o: 0.0001)
    assert rtt == pytest.approx(0.0020) and overlap == pytest.approx(0.00023)
