"""End to end: the QPART planner against fixed strategies, over a real rate-shaped link.

``python -m bench.e2e [--quick] [--json PATH]``  (root: it makes a private network namespace)

The raw grid (16-27 MB for the full one) goes to ``bench/runs/`` by default, which git ignores;
``python -m bench.e2e.summary RAW.json --out bench/results/e2e-<commit>-summary.json`` writes the
figures bench/README.md cites into a small file that is committed (:mod:`bench.e2e.summary`).

The process re-runs itself under ``unshare -n``: a network namespace of its own whose only
interface is loopback, with MTU 1500 and a token-bucket shaper (``tc qdisc ... tbf``) set to each
channel rate in turn. The QPART server (pinned to core 0) and the simulated device
(this process, core 1) talk over 127.0.0.1 inside it, so segment downloads, activation uploads
and answers really cross the shaped link. Nothing else is reachable from inside.

Device compute is this machine's measured time scaled by the profile's speed: with ``H`` the
host's FLOP/s (the whole model's FLOPs over its measured batch-1 time) and ``F`` the profile's
``flops_per_s``, a head that takes ``t`` here takes ``t * H / F`` on the device. ``H`` comes from
the profile just before each cell; within the cell, each round's device seconds are also scaled by
the host's speed in that round against the profile, read from a reference workload that runs among
the round's strategies (:mod:`bench.harness.device_clock`): the device's speed holds still while this shared
machine's wanders. The device profile sent to the planner carries per-cut head times measured
the same way (the profiler of ``qpart device profile``), so prediction and measurement use one
clock. Before every cell the device also measures its link as a device in the field can, on the
link itself (:func:`probe_exchange`): the exchange's fixed overhead (``rtt_s``) and the rate at
which an upload body's bytes cost time (``upload_rate_bps``, ADR 0006). Its plan request carries
the fit of the medians of its last three probes at this rate and model (:data:`PROBE_WINDOW`),
except that the overhead is the median of that fit and what the last two cells' own exchanges
implied (:func:`implied_rtt`, :func:`bench.harness.exchange.overhead`).

Strategies per cell (model, device, rate, weight preset, cache state):

- ``qpart``: the server's plan for a 1% accuracy demand (POST /v1/plan);
- ``all-server``: cut 0, the float32 input uploaded;
- ``all-device``: the last cut, the float32 model downloaded and run on the device;
- ``neurosurgeon``: the cut with the smallest predicted objective, float32 weights and activation;
- ``uniform-int8``: the best cut with every weight tensor and the activation at 8 bits;
- ``qpart-paper``: QPART as published (its bit allocation, at the 1% level), best cut among those
  the calibration kept (``--baseline`` measures it there only);
- ``cut-k``, for every cut k the calibration kept (ADR 0025): the planner's own cheapest pattern at
  cut k among those it may offer for the demand (:func:`bench.e2e.cell.forced_cuts`), so that every
  calibrated cut's prediction is checked, those the planner never chooses included;
- ``input-png``, ``input-webp@75``, ``input-webp@90``, ``input-jpeg@90``: the input image as the
  device holds it, compressed (SC2's naive baseline; :mod:`bench.e2e.baselines`);
- ``autoencoder@k``: an encoder on the device and a decoder on the server at cut k
  (:mod:`bench.harness.autoencoder`; the committed ones in ``bench/results/autoencoder``).

A naive baseline's test drop is the one measured on the whole test split (``input_codecs.json``,
the autoencoder's ``meta.json``); it competes for a cell's best only where that drop keeps the
demand. The baselines' server side is :mod:`bench.harness.baseline_routes`, behind the same shaped link.

Every pattern strategy offers deflate and zstd uploads (ADRs 0005, 0007) and sends its packet the way the
cost model prices cheapest; the device's compression time is part of its encode time (measured,
scaled).

Cells are measured in sittings (:mod:`bench.e2e.sitting`): one model, device and rate, every
preset cold and warm, from one host profile, one link probe and one set of rounds that runs every
distinct pattern of its cells (a pattern's run is the same work whatever the preset or cache). Every
sitting is measured in ``--repetitions`` (at least 3) interleaved repetitions: repetition r of every
device of a rate and model before repetition r + 1 of any, each a whole measurement, with its own
random orders of the rounds. A strategy's figure is the median of its repetitions' medians; a
cell's best is the strategy with the smallest such ``J`` among those that keep the accuracy demand
(:func:`meets_demand`; ``best_any`` ignores the demand); the planner's regret is its ``J`` over the
best's, minus 1, and a loss is significant when the 95% bootstrap interval of that ratio over the
repetitions lies above 1.05 (:mod:`bench.e2e.repetitions`).

Fixed strategies pick their cut with the same cost model and inputs as the planner. Their bit
patterns are served by the same server: the benchmark writes a copy of the artifacts with extra
patterns at level 1.0, which no demand (< 1) ever admits, so the planner never sees them.

Cold cache: the device holds no segment, downloads count. Warm: it holds every segment the cold
cell of the same preset and sitting downloaded. A plan is fetched once per cell and not counted
(devices reuse plans while conditions hold). The strategies run in rounds, one inference each on
the round's test image, in a fresh random order per round, until at least ``--reps`` rounds and
``--cell-seconds`` have passed (at most ``--max-reps`` rounds), in each repetition; a repetition's
figure is the median, plus the one download when cold. (A fixed count would leave the fast cells,
where strategies differ by a tenth of a millisecond in a few milliseconds of noisy round trip, to
too few rounds.)

While the grid runs, one ``SCHED_IDLE`` busy loop per core keeps the cores from halting
(:mod:`bench.harness.spin`; ``--no-spin`` turns it off): on this KVM guest a halted vCPU's wake-up doubled
a loopback exchange's median time and widened its spread threefold, noise the strategies' near
ties drowned in.

CPU steal (time the hypervisor gave this virtual machine's CPUs to others) is recorded per cell.
A sitting that ran under more than ``--steal-gate`` (default 5%) is measured again, at most
``--steal-retries`` (2) more times (:func:`steal_gated`); the decision reads the steal, never a
result. An attempt over the gate, kept or not, leaves nothing in the link windows that price the
cells after it. The JSON keeps every discarded attempt inside its cell, and the summary gives the grid as
first measured (``first_attempts``) beside the grid as recorded.

Measured ``J`` uses the cost model's weights and powers on measured times:
``J = w_t*T + w_e*(P_compute*T_local + P_tx*T_transfer) + w_c*price*T_server``, where
``T_server`` is the queue + compute time the server reports and ``T_transfer`` the rest of the
round trip.

Besides the JSON: a Markdown table (``.md``: per cell the regret with its interval and the nearest
baseline; the median time error per strategy and per forced cut; per model and rate the best
baseline beside the planner), a plot (``.png``: predicted against measured time, the regret with
its interval) and a decision map per model (``-map-<model>.png``: the planner's cut over channel
rate and device, and which strategies beat it where).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import REPO, provenance, write_json
from bench.e2e.artifacts import FLOAT_ID, is_float, with_baselines, write_artifacts
from bench.e2e.baselines import AUTOENCODERS
from bench.e2e.cell import (
    Choice,
    _predict,
    choose_fixed,
    implied_rtt,
    meets_demand,
    run_rounds,
)
from bench.e2e.config import (
    CLOCK,
    DEMAND,
    DEVICES,
    EXTRA_LEVEL,
    FILLER_PORT,
    MODELS,
    PORT,
    PRESET_NAMES,
    QUICK_DEVICES,
    QUICK_MODELS,
    QUICK_PRESETS,
    QUICK_RATES_MBPS,
    RATES_MBPS,
    STRATEGIES,
)
from bench.e2e.device import (
    PROFILE_SECONDS,
    Link,
    ModelView,
    device_profile,
    host_flops_per_s,
    measured_j,
    reprofile,
    run_once,
)
from bench.e2e.figures import decision_map, plot
from bench.e2e.gating import (
    STEAL_GATE,
    STEAL_RETRIES,
    first_attempts,
    gated_summary,
    over_gate,
    sitting_cells,
    steal_gated,
)
from bench.e2e.grid import run
from bench.e2e.probes import fit_link, measure_link, measure_rtt, probe_exchange, probe_rtt
from bench.e2e.report import markdown, summarize
from bench.e2e.sitting import run_sitting
from bench.harness.loadgen import enter_private_network

__all__ = [
    "CLOCK",
    "DEMAND",
    "DEVICES",
    "EXTRA_LEVEL",
    "FILLER_PORT",
    "FLOAT_ID",
    "MODELS",
    "PORT",
    "PRESET_NAMES",
    "PROFILE_SECONDS",
    "QUICK_DEVICES",
    "QUICK_MODELS",
    "QUICK_PRESETS",
    "QUICK_RATES_MBPS",
    "RATES_MBPS",
    "STEAL_GATE",
    "STEAL_RETRIES",
    "STRATEGIES",
    "Choice",
    "Link",
    "ModelView",
    "_predict",
    "choose_fixed",
    "decision_map",
    "default_output",
    "device_profile",
    "first_attempts",
    "fit_link",
    "gated_summary",
    "host_flops_per_s",
    "implied_rtt",
    "is_float",
    "main",
    "markdown",
    "measure_link",
    "measure_rtt",
    "measured_j",
    "meets_demand",
    "over_gate",
    "plot",
    "probe_exchange",
    "probe_rtt",
    "reprofile",
    "run",
    "run_once",
    "run_rounds",
    "run_sitting",
    "sitting_cells",
    "steal_gated",
    "summarize",
    "with_baselines",
    "write_artifacts",
]


RUNS = REPO / "bench" / "runs"
"""Where raw grids go by default: ignored by git (a full grid is 16-27 MB); bench/results holds
their summaries (:mod:`bench.e2e.summary`)."""


def default_output(quick: bool, runs: Path = RUNS) -> Path:
    """A raw grid's default path: ``runs/e2e-<commit>[-quick]-<UTC time>.json``, a name no archived
    result has and no earlier run took."""
    commit = (provenance()["commit"] or "nogit")[:7]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return runs / f"e2e-{commit}{'-quick' if quick else ''}-{stamp}.json"


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path,
                        help="write the raw grid here, plus .md and .png (default: bench/runs/e2e-<commit>"
                             "[-quick]-<UTC time>.json, outside the tree; summarize it into bench/results "
                             "with python -m bench.e2e.summary)")
    parser.add_argument("--quick", action="store_true",
                        help=f"subset (about 6 minutes): models {QUICK_MODELS}, devices {QUICK_DEVICES}, "
                             f"rates {QUICK_RATES_MBPS} Mbit/s, preset {QUICK_PRESETS}, cold and warm")
    parser.add_argument("--repetitions", type=int, default=3,
                        help="interleaved repetitions of every cell (default 3; regret and significance "
                             "come from their medians)")
    parser.add_argument("--reps", type=int, default=5,
                        help="least inference rounds per repetition (its median is its figure; default 5)")
    parser.add_argument("--cell-seconds", type=float, default=2.0,
                        help="keep measuring a repetition's strategies for at least this long (default 2)")
    parser.add_argument("--max-reps", type=int, default=400, help="most rounds per repetition")
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="model(s) (default: all three; --quick: "
                        f"{', '.join(QUICK_MODELS)})")
    parser.add_argument("--rate", action="append", type=float, help="rate(s) in Mbit/s (default: the grid's)")
    parser.add_argument("--steal-gate", type=float, default=STEAL_GATE,
                        help="measure a cell again when the CPU steal it ran under exceeds this share "
                             f"(default {STEAL_GATE}; the first attempt is kept and summarized apart)")
    parser.add_argument("--steal-retries", type=int, default=STEAL_RETRIES,
                        help=f"most extra attempts per cell (default {STEAL_RETRIES}; 0: never again)")
    parser.add_argument("--no-spin", dest="spin", action="store_false",
                        help="let the cores halt when idle (default: a SCHED_IDLE busy loop per core keeps "
                             "them awake, so a wake-up is not the hypervisor's; bench.harness.spin)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    parser.add_argument("--autoencoders", type=Path, default=AUTOENCODERS,
                        help="bench.harness.autoencoder's trained baselines (default: the committed ones)")
    args = parser.parse_args(argv)
    if args.repetitions < 3:
        parser.error(f"--repetitions: at least 3 (a significance needs repetitions), not {args.repetitions}")
    if not 0.0 <= args.steal_gate <= 1.0:
        parser.error(f"--steal-gate is a share of CPU time between 0 and 1, not {args.steal_gate}")
    if args.steal_retries < 0:
        parser.error(f"--steal-retries counts extra attempts: 0 or more, not {args.steal_retries}")
    args.model = args.model or list(QUICK_MODELS if args.quick else MODELS)
    if args.json is None:  # chosen once, before the re-run in the namespace, so both name one file
        args.json = default_output(args.quick)
        argv = [*argv, "--json", str(args.json)]
    enter_private_network("bench.e2e", argv, tools=("tc",), mtu=1500)
    doc = run(args)
    write_json(args.json, doc)
    args.json.with_suffix(".md").write_text(markdown(doc))
    plot(doc, args.json.with_suffix(".png"))
    for m in args.model:
        decision_map(doc, m, args.json.with_name(f"{args.json.stem}-map-{m}.png"))
    print(markdown(doc))
    print(f"raw grid: {args.json}; summarize it with python -m bench.e2e.summary {args.json} "
          f"--out bench/results/{args.json.stem}-summary.json", file=sys.stderr)
