"""bench.e2e's baselines: served by the same server, never admitted by the planner."""

from __future__ import annotations

from collections import deque

import pytest

from bench.e2e import (
    EXTRA_LEVEL,
    FLOAT_ID,
    STRATEGIES,
    ModelView,
    _predict,
    first_attempts,
    gated_summary,
    implied_rtt,
    is_float,
    markdown,
    meets_demand,
    sitting_cells,
    steal_gated,
    summarize,
    with_baselines,
)
from qpart.profiles.artifacts import load_artifact
from qpart.profiles.costs import PlanInputs
from qpart.profiles.devices import get_device
from qpart.server.planning.planner import allowed_patterns
from qpart.server.schemas import PRESETS, WeightPreset

CODINGS = frozenset({"deflate", "zstd"})

def test_baseline_patterns_cover_every_cut_and_no_demand_admits_them(artifacts_dir):
    artifact = load_artifact(artifacts_dir / "fmnist-cnn")
    extended = with_baselines(artifact)
    extra = extended.patterns[len(artifact.patterns):]
    u8 = [p for p in extra if p.pattern_id.startswith("u8-")]
    paper = [p for p in extra if p.pattern_id.startswith("paper-")]
    assert sorted(p.cut for p in u8) == [c.index for c in artifact.cuts]
    assert all(set(p.weight_bits.values()) <= {8} for p in u8)
    assert all(p.activation_bits == 8 for p in u8 if p.cut < len(artifact.cuts) - 1)
    # QPART as published at the cuts the calibration measured it at (--baseline): those it calibrated
    assert sorted(p.cut for p in paper) == artifact.calibrated_cuts
    assert all(p.level == EXTRA_LEVEL for p in extra)
    ids = [p.pattern_id for p in extra]
    assert len(set(ids)) == len(ids) and not set(ids) & {p.pattern_id for p in artifact.patterns}
    for demand in (0.0, 0.01, 0.5, 0.999):
        assert allowed_patterns(extended, demand) == allowed_patterns(artifact, demand)


def test_a_pruned_calibration_keeps_every_baseline_at_every_cut_through_float_patterns(every_cut):
    # a calibration that kept cuts 0, 1 and 8 (ADR 0025): the baselines stay at all nine
    artifact = load_artifact(every_cut / "fmnist-cnn")
    pruned = artifact.model_copy(update={"patterns": [p for p in artifact.patterns if p.cut in (0, 1, 8)]})
    extended = with_baselines(pruned)
    floats = {p.cut: p for p in extended.patterns if p.pattern_id.startswith(FLOAT_ID)}
    assert sorted(floats) == [2, 3, 4, 5, 6, 7]  # the pruned cuts, each with the float head every cut had
    for cut, made in floats.items():
        was = next(p for p in artifact.patterns if p.cut == cut and p.level == 0)
        assert made.level == EXTRA_LEVEL and is_float(made.model_dump()) and not is_float(
            {"level": 0.01, "pattern_id": was.pattern_id})
        assert (made.weight_bytes, made.activation_bytes, made.group_size, made.weight_bits) == (
            was.weight_bytes, was.activation_bytes, was.group_size, was.weight_bits)
    assert sorted(p.cut for p in extended.patterns if p.pattern_id.startswith("u8-")) == list(range(9))
    for demand in (0.0, 0.01, 0.5, 0.999):  # the planner is offered what the pruned artifact holds
        assert allowed_patterns(extended, demand) == allowed_patterns(pruned, demand)


def test_a_published_pattern_competes_only_if_its_test_drop_keeps_the_demand():
    assert meets_demand("qpart-paper", {"test_drop": 0.009})
    assert not meets_demand("qpart-paper", {"test_drop": 0.011})
    assert not meets_demand("qpart-paper", {"test_drop": None})
    assert meets_demand("all-server", {"test_drop": 0.0})


def test_the_table_names_each_cells_repetitions():
    cell = {"model": "m", "device": "d", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "reps": 37,
            "best": "qpart", "qpart_regret": 0.0,
            "strategies": {s: {"measured_J": 1.0, "cut": 0, "meets_demand": True} for s in STRATEGIES}}
    summary = {"cells": 1, "max_regret": 0.0, "cells_regret_over_5pct": 0, "median_time_error": 0.1,
               "cells_qpart_beats": {}}
    row = markdown({"cells": [cell], "summary": summary}).splitlines()[2]
    assert "| cold | 37 | 0 |" in row
    assert markdown({"cells": [cell], "summary": summary}).rstrip().endswith("CPU steal per cell unknown")


def test_the_summary_reports_the_cpu_steal_the_cells_ran_under():
    cell = {"qpart_regret": 0.0, "qpart_plan_check": True,
            "strategies": {s: {"measured_J": 1.0, "predicted_time_s": 1.0, "measured_time_s": 1.0}
                           for s in STRATEGIES}}
    cells = [{**cell, "cpu_steal": 0.02}, {**cell, "cpu_steal": 0.14}, {**cell, "cpu_steal": None}]
    assert summarize(cells)["cpu_steal"] == {"median": 0.08, "max": 0.14}
    assert summarize([cell])["cpu_steal"] is None  # grids from before it was recorded


def _cell(steal: float | None, regret: float) -> dict[str, object]:
    return {"model": "m", "device": "d", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "best": "qpart",
            "qpart_regret": regret, "qpart_plan_check": True, "cpu_steal": steal,
            "strategies": {s: {"measured_J": 1.0, "predicted_J": 1.0, "cut": 0, "predicted_time_s": 1.0,
                               "measured_time_s": 1.0, "meets_demand": True} for s in STRATEGIES}}


def test_a_cell_run_under_steal_is_measured_again_and_its_first_attempt_kept():
    attempts = iter([_cell(0.12, 0.30), _cell(0.02, 0.01)])
    probes = deque(["p1", "p2", "p3"], maxlen=3)  # full, as in a grid
    labels = iter(["first", "second"])

    def measure():
        probes.append(next(labels))
        return next(attempts)

    cell = steal_gated(measure, probes, gate=0.05, retries=2)
    assert cell["cpu_steal"] == 0.02 and cell["qpart_regret"] == 0.01
    assert [d["qpart_regret"] for d in cell["discarded"]] == [0.30]
    # the discarded attempt's probe left the window (p1 came back); the kept attempt's stays
    assert list(probes) == ["p2", "p3", "second"]
    assert first_attempts([cell])[0]["qpart_regret"] == 0.30


def test_the_gate_reads_only_steal_and_gives_up_after_its_retries():
    calls = []

    def stolen():
        calls.append(1)
        return _cell(0.2, 0.0)  # a fine result, still measured again: the steal decides

    cell = steal_gated(stolen, deque(), gate=0.05, retries=2)
    assert len(calls) == 3 and len(cell["discarded"]) == 2 and cell["cpu_steal"] == 0.2
    assert len(steal_gated(stolen, deque(), gate=0.05, retries=0)["discarded"]) == 0
    # kept for want of retries, its probe still leaves the window
    probes = deque(["p1", "p2", "p3"], maxlen=3)

    def stolen_probe():
        probes.append("stolen")
        return _cell(0.2, 0.0)

    steal_gated(stolen_probe, probes, gate=0.05, retries=1)
    assert list(probes) == ["p1", "p2", "p3"]
    # a bad result at low steal, or at the gate itself, is kept as it is
    assert steal_gated(lambda: _cell(0.01, 0.5), deque(), gate=0.05, retries=2)["discarded"] == []
    assert steal_gated(lambda: _cell(0.05, 0.5), deque(), gate=0.05, retries=2)["discarded"] == []
    unknown = steal_gated(lambda: _cell(None, 0.5), deque(), gate=0.05, retries=2)
    assert unknown["discarded"] == []  # no reading, no retry


def test_a_sitting_is_gated_as_one_measurement_and_only_its_kept_traffic_is_remembered():
    steals = iter([0.3, 0.01])  # the first attempt over the gate, the second kept
    implied_of = iter([9.0, 1.0])
    attempts = []

    def measure():
        steal, implied_s = next(steals), next(implied_of)
        cells = [{**_cell(steal, 0.01 * i), "preset": p, "cache": c, "attempt": len(attempts)}
                 for i, (p, c) in enumerate([("a", "cold"), ("a", "warm"), ("b", "cold"), ("b", "warm")])]
        attempts.append(1)
        return {"cells": cells, "cpu_steal": steal, "implied_rtt_s": implied_s, "downloaded": ["seg"]}

    implied = deque(maxlen=2)
    cells = sitting_cells(measure, deque(), implied, gate=0.05, retries=2)
    assert [(c["preset"], c["cache"]) for c in cells] == [("a", "cold"), ("a", "warm"), ("b", "cold"),
                                                          ("b", "warm")]
    assert all(c["attempt"] == 1 for c in cells)  # every cell from the kept attempt
    # each cell carries its own cell of the discarded attempt, for the raw summary
    assert [[(d["preset"], d["cache"], d["attempt"]) for d in c["discarded"]] for c in cells] == [
        [("a", "cold", 0)], [("a", "warm", 0)], [("b", "cold", 0)], [("b", "warm", 0)]]
    assert list(implied) == [1.0]  # one figure a sitting, not the discarded attempt's 9.0
    assert all("downloaded" not in c for c in cells)
    # a sitting kept over the gate (retries spent) prices no later sitting with its traffic
    steals, implied_of = iter([0.3]), iter([7.0])
    implied.clear()
    sitting_cells(measure, deque(), implied, gate=0.05, retries=0)
    assert list(implied) == []


def test_the_gated_summary_reports_the_raw_grid_and_what_stayed_over_the_gate():
    quiet = {**_cell(0.01, 0.02), "discarded": []}
    retried = {**_cell(0.03, 0.01), "discarded": [_cell(0.15, 0.12)]}
    stuck = {**_cell(0.09, 0.07), "discarded": [_cell(0.2, 0.2), _cell(0.1, 0.03)]}
    sm = gated_summary([quiet, retried, stuck], 0.05)
    assert sm["max_regret"] == 0.07 and sm["cells_regret_over_5pct"] == 1
    assert sm["cells_measured_again"] == 2 and sm["cells_over_steal_gate"] == 1
    assert sm["cells_over_steal_gate_regret_over_5pct"] == 1
    assert sm["first_attempts"]["max_regret"] == 0.2 and sm["first_attempts"]["cells_regret_over_5pct"] == 2
    text = markdown({"cells": [], "summary": sm})
    assert ("After the steal gate (each cell's last attempt): Cells: 3; mean regret +3.33%; "
            "95th percentile +7.0%; max regret +7.0%; cells over 5%: 1; significant losses (95% interval "
            "above +5%): 0;") in text
    assert "Steal gate 5%: 2 cells measured again; 1 stayed over the gate" in text
    assert "As first measured: max regret +20.0%; cells over 5%: 2;" in text


def test_the_table_shows_each_cells_steal_and_discarded_attempts():
    cell = {"model": "m", "device": "d", "rate_mbps": 1.0, "preset": "p", "cache": "cold", "reps": 37,
            "best": "qpart", "qpart_regret": 0.0, "cpu_steal": 0.031,
            "strategies": {s: {"measured_J": 1.0, "cut": 0, "meets_demand": True} for s in STRATEGIES},
            "discarded": [_cell(0.12, 0.081)]}
    sm = gated_summary([{**_cell(0.031, 0.0), "discarded": cell["discarded"]}], 0.05)
    row = markdown({"cells": [cell], "summary": sm}).splitlines()[2]
    assert row.endswith("| 3.1% | 2 (+8.1% at 12.0%) |")


def test_a_cells_traffic_implies_the_overhead_its_exchanges_took_beyond_their_priced_bytes(artifacts_dir):
    artifact = with_baselines(load_artifact(artifacts_dir / "fmnist-cnn"))
    cuts = len(artifact.cuts)
    model = ModelView("fmnist-cnn", artifact.version, cuts, [0.0] * cuts, [], artifact, [], [], 200)
    inputs = PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.LATENCY_FIRST], 20e6, 0.9e-3, 1, 1.0,
                        frozenset(), upload_codings=CODINGS)
    plans = {f"{pid}/identity": {"pattern_id": pid, "cut": 0, "segment": None, "upload_encoding": "identity"}
             for pid in ("u8-c0", "c0-81c59f5957aefb40")}
    bare = PlanInputs(inputs.device, inputs.weights, 20e6, 0.0, 1, 1.0, frozenset(), upload_codings=CODINGS)
    runs = {}
    for k, p in plans.items():
        wire = _predict(model, p, bare)["time_s"]["transfer"]
        # exchanges that took 1.5 ms beyond their priced bytes, whatever the server's time
        runs[k] = [{"local": 0.0, "server": s, "round_trip": s + wire + 1.5e-3} for s in (1e-3, 2e-3, 3e-3)]
    assert implied_rtt(model, plans, runs, inputs) == pytest.approx(1.5e-3)
    assert implied_rtt(model, {}, runs, inputs) is None  # all-device: nothing crossed the link


def test_the_overhead_a_cold_cell_implies_leaves_its_segment_downloads_out(artifacts_dir):
    artifact = with_baselines(load_artifact(artifacts_dir / "fmnist-cnn"))
    cuts = len(artifact.cuts)
    model = ModelView("fmnist-cnn", artifact.version, cuts, [0.0] * cuts, [], artifact, [], [], 200)
    inputs = PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.ENERGY_FIRST], 5e6, 2e-3, 1, 1.0,
                        frozenset(), upload_codings=CODINGS)  # cold: the device holds no segment
    head = next(p for p in artifact.patterns if p.cut == 1 and p.level == 0.01)
    plan = {"pattern_id": head.pattern_id, "cut": 1, "segment": {"id": "seg-1", "size_bytes": 1 << 20}}
    held = PlanInputs(inputs.device, inputs.weights, 5e6, 0.0, 1, 1.0, frozenset({"seg-1"}),
                      upload_codings=CODINGS)
    wire = _predict(model, plan, held)["time_s"]["transfer"]
    assert _predict(model, plan, inputs)["time_s"]["transfer"] > wire + 1.0  # a MiB at 5 Mbit/s
    runs = {"k": [{"local": 0.0, "server": 1e-3, "round_trip": 1e-3 + wire + 0.7e-3}]}
    assert implied_rtt(model, {"k": plan}, runs, inputs) == pytest.approx(0.7e-3)


def test_idle_spinners_run_one_busy_loop_per_core_at_sched_idle_and_stop():
    import os
    import time

    from bench.harness.spin import IdleSpinners

    with IdleSpinners() as spinners:
        assert len(spinners._procs) == len(os.sched_getaffinity(0))
        deadline = time.monotonic() + 10  # each child sets its policy first thing
        while time.monotonic() < deadline and not all(
                os.sched_getscheduler(p.pid) == os.SCHED_IDLE for p in spinners._procs):
            time.sleep(0.01)
        for p in spinners._procs:
            assert p.poll() is None and os.sched_getscheduler(p.pid) == os.SCHED_IDLE
        procs = list(spinners._procs)
    assert all(p.poll() is not None for p in procs)  # gone with the block
    with IdleSpinners(enabled=False) as none:
        assert none._procs == []


def test_idle_spinners_die_with_a_parent_killed_outright(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys, time\nfrom bench.harness.spin import IdleSpinners\n"
              "with IdleSpinners() as s:\n    print(' '.join(str(p.pid) for p in s._procs), flush=True)\n"
              "    time.sleep(60)\n")
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert children
        parent.send_signal(signal.SIGKILL)  # no __exit__ runs
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_implied_overhead_prices_each_plan_in_the_coding_it_was_sent_in(artifacts_dir, monkeypatch):
    import types

    from bench.e2e import cell

    artifact = with_baselines(load_artifact(artifacts_dir / "fmnist-cnn"))
    cuts = len(artifact.cuts)
    model = ModelView("fmnist-cnn", artifact.version, cuts, [0.0] * cuts, [], artifact, [], [], 200)
    bare = PlanInputs(get_device("phone-soc"), PRESETS[WeightPreset.LATENCY_FIRST], 1e6, 0.0, 1, 1.0,
                      frozenset(), upload_codings=CODINGS)
    transfer = {"identity": 4e-3, "zstd": 3e-3}  # the pattern priced in each coding

    def options(*args, **kwargs):
        return [types.SimpleNamespace(upload_encoding=c, time_s=types.SimpleNamespace(transfer=t))
                for c, t in transfer.items()]

    monkeypatch.setattr(cell, "price_options", options)
    pid = "c0-81c59f5957aefb40"
    plans = {f"{pid}/{c}": {"pattern_id": pid, "cut": 0, "segment": None, "upload_encoding": c}
             for c in transfer}
    for p in plans.values():
        assert cell._transfer_as_sent(model, p, bare) == transfer[p["upload_encoding"]]
    runs = {k: [{"local": 0.0, "server": 1e-3, "round_trip": 1e-3 + transfer[p["upload_encoding"]] + 2e-3}]
            for k, p in plans.items()}
    assert implied_rtt(model, plans, runs, bare) == pytest.approx(2e-3)  # both keys: the same 2 ms


def test_a_strategys_server_time_is_recorded_in_its_parts():
    from bench.e2e.device import SERVER_PARTS, measured_j, server_parts
    from qpart.profiles.devices import get_device

    runs = [{"local": 0.0, "round_trip": 0.01, "upload_bytes": 10.0, "server": q + c,
             **server_parts({"queue_s": q, "compute_s": c}, f"decode;dur={d}")}
            for q, c, d in [(1e-4, 2e-3, 0.2), (3e-4, 3e-3, 0.4), (2e-4, 4e-3, 0.3)]]
    measured = measured_j(get_device("raspberry-pi-4"), "latency-first", 0.0, 0.0, runs)
    assert SERVER_PARTS == ("queue", "compute", "decode")
    assert measured["measured_queue_s"] == pytest.approx(2e-4)
    assert measured["measured_compute_s"] == pytest.approx(3e-3)
    assert measured["measured_decode_s"] == pytest.approx(3e-4)
    assert server_parts({"queue_s": 0, "compute_s": 1e-3}, None)["decode"] == 0.0
