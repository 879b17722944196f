"""``qpart calibrate`` and ``qpart measure-coding``: the calibration job's commands (registered on
the ``qpart`` app by :mod:`qpart.cli`), importing the job lazily."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from qpart.errors import UsageError
from qpart.flags import env_help, is_advanced, settings_from
from qpart.offline.settings import CalibrationSettings, Estimator

CALIB = CalibrationSettings
ADVANCED_PANEL = "Advanced"
"""The help panel of the options that set a setting marked advanced (the method's internals)."""


def setting_option(field: str, text: str | None = None) -> Any:
    """The option that sets the calibration setting ``field``: its help from the field (or ``text``),
    its default and variable, under :data:`ADVANCED_PANEL` when the field is marked advanced. The
    command passes each such parameter, by its name, to the settings."""
    panel = ADVANCED_PANEL if is_advanced(CALIB.model_fields[field]) else None
    return typer.Option(help=env_help(CALIB, field, text), rich_help_panel=panel)


LISTS: dict[str, tuple[type, str]] = {
    "levels": (float, "fractions separated by commas, e.g. 0.005,0.01 for 0.5% and 1%"),
    "ladder": (int, "grid steps separated by commas, e.g. -4,-2,-1,0,1,2,3"),
    "envelope_speeds": (float, "numbers separated by commas, e.g. 0.1,1,10"),
    "envelope_rates_mbps": (float, "the lowest and highest rate, e.g. 0.1,1000"),
    "envelope_server_flops": (float, "numbers separated by commas, e.g. 1e10,3e10"),
}
"""The settings an option gives as numbers separated by commas: their type, and what to give."""


def parse_list(name: str, text: str | None) -> tuple[float, ...] | None:
    """The option for the setting ``name`` (one of :data:`LISTS`): its numbers (None: not given)."""
    if text is None:
        return None
    kind, what = LISTS[name]
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--{name.replace('_', '-')} {text!r}: give {what}") from None


class _RichSink:
    """Adapts the calibration job's progress reports to rich progress bars."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def start(self, label: str, total: int) -> Callable[[int], None]:
        task = self.bar.add_task(label, total=total)
        return lambda done: self.bar.update(task, completed=done)


def calibrate(
    model: Annotated[str, typer.Option(help="Registered model name.")],
    out: Annotated[Path, typer.Option(help="Output folder for artifact.json, validation.json, report.md.")],
    weights: Annotated[Path | None, typer.Option(help="Override the registered weights.")] = None,
    levels: Annotated[str | None, setting_option(
        "levels", "Accuracy levels, as fractions of the --metric, comma-separated")] = None,
    estimator: Annotated[Estimator | None, setting_option("estimator")] = None,
    fit_samples: Annotated[int | None, setting_option("fit_samples")] = None,
    check_samples: Annotated[int | None, setting_option("check_samples")] = None,
    noise_samples: Annotated[int | None, setting_option("noise_samples")] = None,
    mapping_points: Annotated[int | None, setting_option("mapping_points")] = None,
    metric: Annotated[str | None, setting_option("metric")] = None,
    confidence: Annotated[float | None, setting_option(
        "confidence", "1 − δ, the probability over the check samples that each pattern keeps its level "
        "(0.95: δ = 0.05)")] = None,
    seed: Annotated[int | None, setting_option("seed")] = None,
    threads: Annotated[int | None, setting_option("threads", "torch threads")] = None,
    workers: Annotated[int | None, setting_option("workers")] = None,
    device: Annotated[str | None, setting_option("device")] = None,
    cuts: Annotated[str | None, setting_option("cuts")] = None,
    baseline: Annotated[bool | None, setting_option("baseline")] = None,
    data: Annotated[str | None, setting_option("data")] = None,
    test_data: Annotated[str | None, setting_option("test_data")] = None,
    test_fraction: Annotated[float | None, setting_option("test_fraction")] = None,
    split_seed: Annotated[int | None, setting_option("split_seed")] = None,
    sample_order: Annotated[str | None, setting_option("sample_order")] = None,
    uncertified: Annotated[str | None, setting_option("uncertified")] = None,
    labels: Annotated[str | None, setting_option("labels")] = None,
    probes: Annotated[int | None, setting_option("probes")] = None,
    measure_both: Annotated[bool | None, setting_option("measure_both")] = None,
    min_bits: Annotated[int | None, setting_option("min_bits")] = None,
    max_bits: Annotated[int | None, setting_option("max_bits")] = None,
    activation_group: Annotated[int | None, setting_option("activation_group")] = None,
    bound: Annotated[str | None, setting_option("bound")] = None,
    budget_units: Annotated[int | None, setting_option("budget_units")] = None,
    refine_points: Annotated[int | None, setting_option("refine_points")] = None,
    ladder_steps: Annotated[int | None, setting_option("ladder_steps")] = None,
    ladder: Annotated[str | None, setting_option("ladder", "Rungs, comma-separated, in grid steps from "
                                                 "the largest budget that passes on the fit samples")] = None,
    search_octaves: Annotated[int | None, setting_option("search_octaves")] = None,
    envelope_margin: Annotated[float | None, setting_option("envelope_margin")] = None,
    envelope_devices: Annotated[str | None, setting_option(
        "envelope_devices", "cuts auto: the shipped device profiles the envelope prices, comma-separated "
        "(default: all of them)")] = None,
    envelope_speeds: Annotated[str | None, setting_option("envelope_speeds")] = None,
    envelope_rates_mbps: Annotated[str | None, setting_option("envelope_rates_mbps")] = None,
    envelope_rate_points: Annotated[int | None, setting_option("envelope_rate_points")] = None,
    envelope_server_flops: Annotated[str | None, setting_option("envelope_server_flops")] = None,
    envelope_price: Annotated[float | None, setting_option("envelope_price")] = None,
    envelope_probe_samples: Annotated[int | None, setting_option("envelope_probe_samples")] = None,
    spill_above_mb: Annotated[int | None, setting_option("spill_above_mb")] = None,
    as_json: Annotated[bool, typer.Option("--json", help=(
        "At the end, print one JSON document in place of the summary line: stage seconds, pattern "
        "and violation counts, the output files."))] = False,
    executor: Annotated[str, typer.Option(help=(
        "Where the validation stage runs: local (this machine's processes) or ray (tasks on a Ray "
        "cluster; pip install 'qpart-serving\\[ray]'). The artifact is the same."))] = "local",
    ray_address: Annotated[str | None, typer.Option(help=(
        "The Ray cluster for --executor ray: HOST:PORT of its head, or auto (the cluster this "
        "machine is part of); default: a Ray instance started on this machine for the job."))] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help=(
        "Discard the checkpoints in OUT/checkpoint and start afresh. Without it, a job run again "
        "with the same model, data and settings resumes from them (and writes the same artifact.json); "
        "with other inputs it is refused."))] = False,
) -> None:
    """Measure noise tables, allocate and validate one bit pattern per (cut, level). Each stage is
    checkpointed in OUT/checkpoint: a job that was killed resumes when run again. Other settings,
    the advanced ones among them: QPART_CALIB_* (docs/configuration.md)."""
    # Each parameter named as a setting sets it (first, while the locals are the parameters only).
    flags = {name: value for name, value in locals().items() if name in CALIB.model_fields}
    settings = settings_from(CalibrationSettings, {
        **flags, **{name: parse_list(name, flags[name]) for name in LISTS},
        "envelope_devices": None if envelope_devices is None else tuple(envelope_devices.split(","))})
    from dataclasses import replace

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from qpart.models.registry import get_model
    from qpart.offline.job import calibrate as run_job
    from qpart.progress import progress_bars

    if executor not in ("local", "ray"):
        raise UsageError(f"--executor must be local or ray, not {executor!r}")
    if ray_address is not None and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    if executor == "ray" and settings.device != "cpu":
        raise UsageError("--executor ray runs on CPUs: drop --device cuda, or run the job locally on the GPU")
    from qpart.offline.ray_executor import ray_executor

    spec = get_model(model)
    if weights is not None:
        spec = replace(spec, weights=weights)
    # SIGTERM (kubectl delete, docker stop, timeout) ends the job as an exception would, so that its
    # temporary sample files are removed; the checkpoints stay for a resume.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        with progress_bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()) as bar:
            artifact = run_job(spec, settings, out, _RichSink(bar), fresh=fresh,
                               executor=ray_executor(ray_address) if executor == "ray" else None)
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGTERM:
            typer.echo(f"error: terminated (SIGTERM); the finished stages stay in {out}/checkpoint: the same "
                       "command resumes from them", err=True)
        raise
    graded = [p for p in artifact.patterns if p.level > 0 and p.test_drop is not None]
    bad = sum(1 for p in graded if p.test_drop is not None and p.test_drop > p.level)
    if as_json:
        stages = _rounded_stages({k.removeprefix("stage_"): v for k, v in artifact.timing_s.items()
                                  if k.startswith("stage_")})
        typer.echo(json.dumps({
            "model": model, "out": str(out), "cuts": len(artifact.cuts),
            "calibrated_cuts": artifact.calibrated_cuts,
            "levels": sorted({p.level for p in artifact.patterns if p.level > 0}),
            "patterns": len(artifact.patterns), "graded_patterns": len(graded), "test_violations": bad,
            "lossless_levels": artifact.lossless_levels,
            "stage_s": stages, "total_s": round(artifact.timing_s["total_without_report"], 3),
            "peak_rss_mib": {k.removeprefix("peak_rss_mib_"): round(v, 1)
                             for k, v in artifact.timing_s.items() if k.startswith("peak_rss_mib_")},
            "files": [str(out / f) for f in ("artifact.json", "timing.json", "validation.json",
                                             "report.md", "weights.safetensors")]}))
        return
    typer.echo(f"{model}: {len(graded)} patterns, {bad} violations on the test split"
               f"{_lossless_note(artifact)}; cuts {', '.join(map(str, artifact.calibrated_cuts))} of "
               f"{len(artifact.cuts)} calibrated{_pruned_note(artifact)}; "
               f"wrote {out}/artifact.json, validation.json, report.md")


def _pruned_note(artifact: Any) -> str:
    """The summary line's clause on the cuts left out, if any."""
    choice = artifact.cut_choice
    if choice is None or not choice.pruned:
        return ""
    why = "no plan in the envelope comes near them" if choice.mode == "envelope" else "not named"
    return f" ({len(choice.pruned)} left out: {why}; report.md says why each)"


def _lossless_note(artifact: Any) -> str:
    """The summary line's clause on the levels kept lossless (--uncertified lossless), if any."""
    levels = artifact.lossless_levels
    if not levels:
        return ""
    from qpart.offline.sizing import percent

    kept = sum(1 for p in artifact.patterns if p.level in levels)
    return (f" ({kept} of them lossless, untested: {', '.join(percent(a) for a in levels)} kept float32, "
            "too few check samples to certify them)")


def measure_coding(
    artifact: Annotated[Path, typer.Option(help="Artifact folder (artifact.json + weights.safetensors).")],
    samples: Annotated[int, typer.Option(help="Calibration fit samples to measure on.")] = 500,
    data: Annotated[str | None, typer.Option(help=(
        "Where the calibration data is now, as calibrate's --data named it (for a split source: "
        "the source before the split); default: where the artifact records it was read. Refused "
        "unless it holds the recorded content."))] = None,
) -> None:
    """Measure how far each cut's activation packets shrink under the deflate and zstd upload
    codings, into an existing artifact (calibrate does this for new ones); the planner prices
    compressed uploads with it."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from qpart.offline.coding import measure_artifact
    from qpart.progress import progress_bars

    with progress_bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn()) as bar:
        advance = _RichSink(bar).start("upload coding", _cut_count(artifact))
        measured = measure_artifact(artifact, samples, advance, data=data)
    for cut in measured.cuts:
        for coding, ratios in cut.coding_ratio.items():
            shown = ", ".join(f"{b}b {r:.2f}" for b, r in sorted(ratios.items()))
            typer.echo(f"cut {cut.index} {coding}: {shown}")
    typer.echo(f"wrote {artifact}/artifact.json")


def calibrate_images(
    artifact: Annotated[Path, typer.Option(help="Artifact folder (artifact.json + weights.safetensors).")],
    qualities: Annotated[str | None, typer.Option(help=(
        "WebP qualities to test, comma-separated; tested from the highest down, so order does not "
        "matter. Default: the artifact's image_qualities setting, else "
        + ",".join(map(str, CALIB.model_fields["image_qualities"].default)) + "."))] = None,
    data: Annotated[str | None, typer.Option(help=(
        "Where the calibration data is now, as calibrate's --data named it; default: where the "
        "artifact records it was read. Refused unless it holds the recorded content."))] = None,
    test_data: Annotated[str | None, typer.Option(help=(
        "Where the test data is now, as calibrate's --test-data named it (default: as recorded)."))] = None,
    replace: Annotated[bool, typer.Option(help=(
        "Replace the artifact's ladder. A ladder is tested on the check samples once; testing "
        "another on the same samples and keeping the better-looking one voids the promise."))] = False,
) -> None:
    """Measure the lossy input-image plan's WebP quality ladder (ADR 0015) into an existing
    artifact (calibrate does this for new ones): each quality is tested per level on the
    artifact's check samples, with its promise's confidence and bound, from the highest quality
    down until the first failure, and each promised quality is measured once on its test samples.
    Only for a model whose card declares preprocessing, on data that holds images."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from qpart.offline.image_ladder import measure_artifact_images
    from qpart.progress import progress_bars

    ladder_qualities = None if qualities is None else _qualities(qualities)
    loaded = _load(artifact)
    record = loaded.data
    total = 0 if record is None else record.check_samples + record.test_samples
    with progress_bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn()) as bar:
        advance = _RichSink(bar).start("input-image ladder", total)
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            advance(done[0])

        ladder = measure_artifact_images(artifact, ladder_qualities, tick, data=data, test_data=test_data,
                                         replace_ladder=replace)
    for rung in ladder.rungs:
        levels = ", ".join(f"{a:g}" for a in rung.levels) or "none"
        test = "" if rung.test_drop is None else f", test drop {rung.test_drop:+.4f}"
        typer.echo(f"webp@{rung.quality}: {rung.mean_bytes:.0f} B, check drop {rung.calib_drop:+.4f} "
                   f"(bound {rung.calib_drop_ub:.4f}){test}; promised at {levels}")
    typer.echo(f"wrote {artifact}/artifact.json")


def _qualities(text: str) -> list[int]:
    """``--qualities``: integers 1 to 100, highest first."""
    try:
        out = sorted({int(q) for q in text.split(",")}, reverse=True)
    except ValueError:
        raise UsageError(f"--qualities {text!r}: give integers 1 to 100 separated by commas") from None
    if not out or not all(1 <= q <= 100 for q in out):
        raise UsageError(f"--qualities {text!r}: give integers 1 to 100 separated by commas")
    return out


def _load(folder: Path) -> Any:
    from qpart.profiles.artifacts import load_artifact

    return load_artifact(folder)


def _cut_count(folder: Path) -> int:
    """How many cuts the artifact in ``folder`` has (the progress bar's length)."""
    from qpart.profiles.artifacts import load_artifact

    return len(load_artifact(folder).cuts)


def _terminated(signum: int, frame: object) -> None:
    # Once: a second SIGTERM (a process group's, a supervisor's retry) must not interrupt the clean-up
    # the first started (the pool's workers stopping, the sample files going) with a traceback.
    signal.signal(signum, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _rounded_stages(seconds: dict[str, float]) -> dict[str, float]:
    """Stage seconds to the millisecond, rounded at the stages' cumulative ends so that they sum
    to the rounded end of the last stage (five values rounded one by one could sum past the
    rounded total by up to 2.5 ms)."""
    out: dict[str, float] = {}
    end = previous = 0.0
    for name, value in seconds.items():
        end += value
        out[name] = round(round(end, 3) - previous, 3)
        previous = round(end, 3)
    return out
