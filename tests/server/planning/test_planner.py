"""The cost model's transfer term: bodies, one round trip and one header allowance per exchange,
the upload time the server's request handling hides, and the upload body's own rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qpart.kernels.coding import Coding
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.costs import HTTP_EXCHANGE_BYTES, PlanInputs
from qpart.profiles.devices import get_device
from qpart.server.planning.planner import coding_header_bytes, price, price_upload
from qpart.server.schemas import PRESETS, WeightPreset


@pytest.fixture(scope="module")
def artifact(artifacts_dir):
    return load_artifact(artifacts_dir / "fmnist-cnn")


def _middle(artifact):
    """The 1% pattern at the first calibrated cut between the input and the output: it downloads a
    head and uploads an activation."""
    cut = min(p.cut for p in artifact.patterns if 0 < p.cut < len(artifact.cuts) - 1)
    return next(p for p in artifact.patterns if p.cut == cut and p.level == 0.01)


def _inputs(held=frozenset(), overlap=0.0, batch=1):
    return PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.LATENCY_FIRST], 8e6, 0.01, batch, 1.0,
                      frozenset(held), overlap)


@pytest.mark.parametrize("held", [False, True])
def test_a_middle_cut_downloads_unless_held_and_always_uploads(artifact, held):
    p = _middle(artifact)
    costs = price(artifact, p, "seg", 5000, _inputs({"seg"} if held else set()), 0.001, answer_bytes=600)
    exchanges = 1 if held else 2
    sent = (0 if held else 5000) + p.activation_bytes + 600 + exchanges * HTTP_EXCHANGE_BYTES
    assert costs.transfer_bytes == sent
    assert costs.time_s.transfer == pytest.approx(sent * 8 / 8e6 + exchanges * 0.01)
    assert costs.time_s.server == 0.001


@pytest.mark.parametrize("held", [False, True])
def test_the_last_cut_only_downloads(artifact, held):
    last = len(artifact.cuts) - 1
    p = next(p for p in artifact.patterns if p.cut == last and p.level == 0)
    costs = price(artifact, p, "seg", 9000, _inputs({"seg"} if held else set()), 0.5, answer_bytes=600)
    assert costs.transfer_bytes == (0 if held else 9000 + HTTP_EXCHANGE_BYTES)
    wire = 9000 + HTTP_EXCHANGE_BYTES
    assert costs.time_s.transfer == pytest.approx(0 if held else wire * 8 / 8e6 + 0.01)
    assert costs.time_s.server == 0 and costs.server_cost == 0


@pytest.mark.parametrize("batch", [1, 3])
def test_the_overlap_hides_only_the_activation_body_and_never_more(artifact, batch):
    p = _middle(artifact)
    body_s = p.activation_bytes * batch * 8 / 8e6
    base = price(artifact, p, "seg", 5000, _inputs(batch=batch), 0.001, answer_bytes=600)
    part = price(artifact, p, "seg", 5000, _inputs(overlap=body_s / 4, batch=batch), 0.001, answer_bytes=600)
    assert part.time_s.transfer == pytest.approx(base.time_s.transfer - body_s / 4)
    assert part.energy_j.transfer == pytest.approx(get_device("phone-soc").power_tx_w * part.time_s.transfer)
    # More overlap than body: the segment download, headers, answer and round trips still count.
    whole = price(artifact, p, "seg", 5000, _inputs(overlap=10.0, batch=batch), 0.001, answer_bytes=600)
    assert whole.time_s.transfer == pytest.approx(base.time_s.transfer - body_s)
    assert whole.transfer_bytes == base.transfer_bytes


def test_the_overlap_changes_nothing_without_an_upload(artifact):
    last = len(artifact.cuts) - 1
    p = next(p for p in artifact.patterns if p.cut == last and p.level == 0)
    base = price(artifact, p, "seg", 9000, _inputs(), 0.5)
    assert price(artifact, p, "seg", 9000, _inputs(overlap=1.0), 0.5) == base


@pytest.mark.parametrize("batch", [1, 3])
def test_an_upload_rate_prices_only_the_activation_body(artifact, batch):
    p = _middle(artifact)
    body = p.activation_bytes * batch
    base = price(artifact, p, "seg", 5000, _inputs(batch=batch), 0.001, answer_bytes=600)
    faster = price(artifact, p, "seg", 5000, replace(_inputs(batch=batch), upload_rate_bps=32e6), 0.001,
                   answer_bytes=600)
    # the body at 32 Mbit/s, the download, headers and answer still at 8
    assert faster.time_s.transfer == pytest.approx(base.time_s.transfer - body * 8 / 8e6 + body * 8 / 32e6)
    assert faster.transfer_bytes == base.transfer_bytes
    same = price(artifact, p, "seg", 5000, replace(_inputs(batch=batch), upload_rate_bps=8e6), 0.001,
                 answer_bytes=600)
    assert same == base
    # a deflated body goes at the upload rate too, its coding header at the rate
    ratio = 0.5
    raw = price_upload(artifact, p, "seg", 5000, replace(_inputs(batch=batch), upload_rate_bps=32e6), 0.001,
                       600, ratio=ratio, coding=Coding.DEFLATE)
    plain = price_upload(artifact, p, "seg", 5000, _inputs(batch=batch), 0.001, 600, ratio=ratio,
                         coding=Coding.DEFLATE)
    assert raw.time_s.transfer == pytest.approx(plain.time_s.transfer - body * ratio * 8 / 8e6
                                                + body * ratio * 8 / 32e6)


def _deflating(rate_bps, seconds=1e-4, offer=True):
    """phone-soc with a measured deflate time (``seconds`` for every cut and bits; None: none)."""
    from qpart.profiles.devices import MeasuredHeads

    base = get_device("phone-soc")

    def inputs(artifact):
        times = [] if seconds is None else [dict.fromkeys([*range(1, 9), 32], seconds)] * len(artifact.cuts)
        heads = MeasuredHeads(version=artifact.version, head_s=[0.0] * len(artifact.cuts),
                              coding_s={Coding.DEFLATE: times}, warmup=0, repeats=1)
        return PlanInputs(base.model_copy(update={"measured": {artifact.model: heads}}),
                          PRESETS[WeightPreset.LATENCY_FIRST], rate_bps, 0.01, 1, 1.0, frozenset(), 0.0,
                          upload_codings=frozenset({Coding.DEFLATE} if offer else ()))

    return base, inputs


def test_a_slow_link_deflates_the_upload_at_the_measured_ratio_plus_the_deflate_time(artifact):
    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    ratio = artifact.cuts[0].coding_ratio[Coding.DEFLATE][32]
    assert 0 < ratio < 1
    _, inputs = _deflating(1e6)
    coded = price(artifact, p, None, 0, inputs(artifact), 0.001, 600)
    plain = price(artifact, p, None, 0, replace(inputs(artifact), upload_codings=frozenset()), 0.001, 600)
    assert (plain.upload_encoding, coded.upload_encoding) == ("identity", "deflate")
    saved = p.activation_bytes * (1 - ratio) - coding_header_bytes("deflate")  # the header field costs too
    assert abs(plain.transfer_bytes - coded.transfer_bytes - saved) <= 1  # whole bytes reported
    assert coded.time_s.local - plain.time_s.local == pytest.approx(1e-4)
    assert plain.time_s.transfer - coded.time_s.transfer == pytest.approx(saved * 8 / 1e6)


def test_each_offered_coding_is_priced_at_its_own_ratio_and_time_and_the_cheaper_wins(artifact):
    from qpart.profiles.devices import MeasuredHeads
    from qpart.server.planning.planner import price_options

    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    ratios = {Coding.DEFLATE: {32: 0.30}, Coding.ZSTD: {32: 0.35}}
    cuts = [c.with_coding_ratios(ratios) for c in artifact.cuts]
    coded = artifact.model_copy(update={"cuts": cuts})
    n = len(artifact.cuts)

    def inputs(deflate_s, zstd_s, offered=frozenset(Coding)):
        times = {Coding.DEFLATE: [{32: deflate_s}] * n, Coding.ZSTD: [{32: zstd_s}] * n}
        heads = MeasuredHeads(version=artifact.version, head_s=[0.0] * n, warmup=0, repeats=1, coding_s=times)
        device = get_device("phone-soc").model_copy(update={"measured": {artifact.model: heads}})
        return PlanInputs(device, PRESETS[WeightPreset.LATENCY_FIRST], 1e6, 0.01, 1, 1.0, frozenset(), 0.0,
                          upload_codings=offered)

    raw, deflated, zstd = price_options(coded, p, None, 0, inputs(1e-3, 1e-5), 0.001, 600)
    assert [c.upload_encoding for c in (raw, deflated, zstd)] == ["identity", "deflate", "zstd"]
    assert zstd.transfer_bytes - deflated.transfer_bytes == pytest.approx(
        p.activation_bytes * 0.05 + coding_header_bytes("zstd") - coding_header_bytes("deflate"), abs=1)
    assert zstd.time_s.local - raw.time_s.local == pytest.approx(1e-5)
    assert deflated.time_s.local - raw.time_s.local == pytest.approx(1e-3)
    # zstd's 157 more bytes cost 1.25 ms at 1 Mbit/s: worth it against a 3 ms deflate, not a 10 us one
    assert price(coded, p, None, 0, inputs(3e-3, 1e-5), 0.001, 600).upload_encoding == "zstd"
    assert price(coded, p, None, 0, inputs(1e-5, 1e-5), 0.001, 600).upload_encoding == "deflate"
    only_deflate = inputs(1e-3, 1e-5, frozenset({Coding.DEFLATE}))
    assert [c.upload_encoding for c in price_options(coded, p, None, 0, only_deflate, 0.001, 600)] == [
        "identity", "deflate"]
    unmeasured = artifact.model_copy(update={"cuts": [c.with_coding_ratios({Coding.ZSTD: {}}) for c in cuts]})
    assert "zstd" not in [c.upload_encoding for c in
                          price_options(unmeasured, p, None, 0, inputs(1e-3, 1e-5), 0.001, 600)]
    # a coding that does not shrink this cut's packets (ratio >= 1, e.g. ResNet's cut 8) is not priced
    for ratio in (1.0, 1.02):
        growing = artifact.model_copy(update={"cuts": [c.with_coding_ratios({Coding.ZSTD: {32: ratio}})
                                                       for c in cuts]})
        assert [c.upload_encoding for c in price_options(growing, p, None, 0, inputs(1e-3, 0.0), 0.001,
                                                          600)] == ["identity", "deflate"]


def test_each_option_is_charged_its_own_codings_server_decoding_per_sample(artifact):
    """ADR 0017: the server's decoding of the upload's coding is server time beside the tail, per
    sample; a coding the server has no figure for costs 0; the last cut uploads nothing."""
    from qpart.server.planning.planner import price_options

    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    _, make = _deflating(1e6)
    decode = {"identity": 2e-4, "deflate": 5e-4, "zstd": 9e-4}
    for batch in (1, 3):
        inputs = replace(make(artifact), batch=batch)
        raw, deflated = price_options(artifact, p, None, 0, inputs, 0.001, 600, decode)
        bare_raw, bare_deflated = price_options(artifact, p, None, 0, inputs, 0.001, 600)
        assert (raw.upload_encoding, deflated.upload_encoding) == ("identity", "deflate")
        assert raw.time_s.server == pytest.approx((0.001 + 2e-4) * batch)
        assert deflated.time_s.server == pytest.approx((0.001 + 5e-4) * batch)
        assert bare_raw.time_s.server == bare_deflated.time_s.server == pytest.approx(0.001 * batch)
        assert raw.server_cost == pytest.approx(raw.time_s.server)  # price_per_second 1
        assert raw.objective > bare_raw.objective and deflated.objective > bare_deflated.objective
    only_raw = price_options(artifact, p, None, 0, make(artifact), 0.001, 600, {"identity": 2e-4})
    assert only_raw[1].time_s.server == pytest.approx(0.001)  # no deflate figure: 0
    last = next(p for p in artifact.patterns if p.cut == len(artifact.cuts) - 1)
    assert price_options(artifact, last, "s", 100, make(artifact), 0.0, 600, decode)[0].time_s.server == 0.0


def test_a_fast_link_or_a_slow_deflate_sends_the_packet_as_is(artifact):
    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    _, fast = _deflating(1e9)
    assert price(artifact, p, None, 0, fast(artifact), 0.001, 600).upload_encoding == "identity"
    _, slow = _deflating(1e6, seconds=0.5)
    assert price(artifact, p, None, 0, slow(artifact), 0.001, 600).upload_encoding == "identity"


def test_no_deflate_without_the_offer_the_ratio_or_the_device_times(artifact):
    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    _, not_offered = _deflating(1e6, offer=False)
    assert price(artifact, p, None, 0, not_offered(artifact), 0.001, 600).upload_encoding == "identity"
    _, unmeasured = _deflating(1e6, seconds=None)
    assert price(artifact, p, None, 0, unmeasured(artifact), 0.001, 600).upload_encoding == "identity"
    bare = artifact.model_copy(update={"cuts": [c.with_coding_ratios({Coding.DEFLATE: {}})
                                                for c in artifact.cuts]})
    _, offered = _deflating(1e6)
    assert price(bare, p, None, 0, offered(bare), 0.001, 600).upload_encoding == "identity"
    last = next(p for p in artifact.patterns if p.cut == len(artifact.cuts) - 1)
    assert price(artifact, last, "s", 100, offered(artifact), 0.0, 600).upload_encoding == "identity"


def test_a_deadline_sees_the_raw_upload_when_deflating_saves_energy_but_costs_time(artifact):
    """Energy only, a radio that draws 20x the CPU's power, a deflate slower than the bytes it
    saves: deflating is cheaper in J and slower. Both are candidates, so a deadline between their
    times keeps the raw one instead of refusing the pattern."""
    from qpart.server.planning.planner import Candidate, choose, price_options
    from qpart.server.schemas import ObjectiveWeights

    p = next(p for p in artifact.patterns if p.cut == 0 and p.activation_bits == 32)
    saved_s = p.activation_bytes * (1 - artifact.cuts[0].coding_ratio[Coding.DEFLATE][32]) * 8 / 1e6
    _, make = _deflating(1e6, seconds=1.5 * saved_s)
    base = make(artifact)
    device = base.device.model_copy(update={"power_compute_w": 0.5, "power_tx_w": 10.0})
    inputs = replace(base, device=device, weights=ObjectiveWeights(time=0.0, energy=1.0, cost=0.0))
    raw, coded = price_options(artifact, p, None, 0, inputs, 0.001, 600)
    assert coded.objective < raw.objective and coded.time_s.total > raw.time_s.total
    assert price(artifact, p, None, 0, inputs, 0.001, 600) == coded
    candidates = [Candidate(p, None, 0, c) for c in (raw, coded)]
    deadline = (raw.time_s.total + coded.time_s.total) / 2
    assert choose(candidates, None).costs == coded
    assert choose(candidates, deadline).costs == raw


def test_a_plan_says_lossless_only_where_every_candidate_at_the_demand_sends_float32(artifact):
    from qpart.server.planning.planner import Candidate, only_lossless
    from qpart.server.schemas import CostBreakdown

    costs = CostBreakdown.model_construct()  # the flag reads the patterns, not the prices
    lossless = [p for p in artifact.patterns if p.level == 0]
    quantized = next(p for p in artifact.patterns if p.level == 0.01 and p.activation_bits < 32)
    kept = quantized.model_copy(update={"activation_bits": 32,
                                        "weight_bits": dict.fromkeys(quantized.weight_bits, 32)})
    assert only_lossless([Candidate(p, None, 0, costs) for p in lossless])
    assert only_lossless([Candidate(p, None, 0, costs) for p in [*lossless, kept]])  # --uncertified lossless
    assert not only_lossless([Candidate(p, None, 0, costs) for p in [*lossless, quantized]])
