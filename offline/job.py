"""The calibration job: tables → mapping → allocation → Learn then Test → one test measurement.

Order matters for the guarantee: tables, mapping, budgets and ladders come from the fit samples,
the check samples are read once per rung, and the test split once per final pattern, after its
level's choice (no choice reads it).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from qpart.kernels.coding import Coding
from qpart.models.metrics import get_metric
from qpart.models.registry import ModelSpec
from qpart.offline.allocation import Item, allocate, pattern_noise
from qpart.offline.checkpoint import Checkpoints, check_writable, output_error
from qpart.offline.coding import CODING_SAMPLES, CodingRatios, coding_ratios, with_coding_ratios
from qpart.offline.cut_probing import decide_cuts
from qpart.offline.data import Sources, align_labels, check_metric_fits, check_model_fits, open_sources
from qpart.offline.errors import CheckpointMismatchError
from qpart.offline.image_ladder import job_ladder
from qpart.offline.ltt import make_promise
from qpart.offline.memory import keep_freed_memory, peak_rss_mib
from qpart.offline.noise import BITS, Tables, direct_tables, fast_tables, timed
from qpart.offline.patterns import Executor, Plan, all_patterns, resolve_workers
from qpart.offline.pruning import check_named_cuts
from qpart.offline.records import data_record, splits
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import Data, held_samples
from qpart.offline.settings import CalibrationSettings, Estimator
from qpart.offline.sizing import lossless_levels, size_job
from qpart.offline.state import State, key, split_bits
from qpart.offline.validation import PairedDrop, budget_for_level, paired_drop
from qpart.profiles.artifacts import AccuracyPoint, CalibrationArtifact, WeightTensor
from qpart.profiles.devices import builtin_devices


class ProgressSink(Protocol):
    """Where the job reports progress: ``start(label, total)`` returns an ``advance(done)``."""

    def start(self, label: str, total: int) -> Callable[[int], None]: ...


class _Silent:
    def start(self, label: str, total: int) -> Callable[[int], None]:
        return lambda done: None


def _items(runner: ModelRunner, tables: Tables, s: CalibrationSettings) -> dict[int, list[Item]]:
    weight, activation = tables
    allowed = range(s.min_bits, s.max_bits + 1)
    out: dict[int, list[Item]] = {}
    for cut in runner.cuts:
        items = [Item(t.name, t.params, t.shape[0], {b: weight[t.name][b - 1] for b in allowed})
                 for t in runner.head_tensors(cut.index)]
        if str(cut.index) in activation:
            groups = cut.numel // runner.groups[cut.index]
            items.append(Item("@activation", cut.numel, groups,
                              {b: activation[str(cut.index)][b - 1] for b in allowed}))
        out[cut.index] = items
    return out


def _measure_point(st: State, cut: int, budget: float) -> dict[str, Any]:
    """One mapping point as its checkpoint keeps it: where, the point, its fit-sample counts."""
    bits = allocate(st.items[cut], budget, st.settings.budget_units)
    weights, act = split_bits(bits)
    logits = st.runner.run_pattern(st.data.fit.images, cut, weights, act)
    noise = float((logits - st.data.fit_logits).pow(2).sum(1).mean())
    ref, metric = st.data.fit_ref, get_metric(st.settings.metric)
    counts = paired_drop(ref.hits, metric.hits(logits, ref.anchor), metric.paired)
    point = AccuracyPoint(noise=noise, predicted_noise=pattern_noise(st.items[cut], bits), drop=counts.drop)
    return {"cut": cut, "budget": budget, "point": point.model_dump(mode="json"), "key": key(cut, bits),
            "counts": [counts.n, counts.lost, counts.gained]}


def _mapping(st: State, progress: ProgressSink, ck: Checkpoints) -> list[AccuracyPoint]:
    """Noise and drop of DP patterns, on the fit samples: a log grid of budgets over the whole
    range, then bisection points where the drop envelope crosses each level (where D(a) is read).
    Each point is checkpointed; a resumed job replays the saved ones in the same order."""
    s = st.settings
    saved: list[dict[str, Any]] = (ck.load("mapping") or {"points": []})["points"]
    entries: list[dict[str, Any]] = []

    def measure(cut: int, budget: float) -> AccuracyPoint:
        if len(entries) < len(saved):
            entry = saved[len(entries)]
            if (entry["cut"], entry["budget"]) != (cut, budget):
                raise CheckpointMismatchError(f"{ck.path('mapping')} was written by another job (point "
                                              f"{len(entries)}); run again with --fresh to start afresh")
        else:
            entry = _measure_point(st, cut, budget)
        entries.append(entry)
        if len(entries) > len(saved):
            ck.save("mapping", {"points": entries})
        # the ladder's search may ask for the same pattern's counts again
        n, lost, gained = entry["counts"]
        st.fit_cache.setdefault(entry["key"], PairedDrop(n, lost, gained, s.paired))
        return AccuracyPoint.model_validate(entry["point"])

    rng = np.random.default_rng(s.seed)
    all_noise = [v for items in st.items.values() for it in items for v in it.noise.values() if v > 0]
    lo, hi = math.log(min(all_noise)), math.log(max(all_noise) * 4)
    total = s.mapping_points + s.refine_points * len(s.levels)
    advance = progress.start("accuracy mapping", total)
    points = []
    for i in range(s.mapping_points):
        cut = int(rng.integers(0, len(st.runner.cuts)))
        budget = math.exp(lo + (hi - lo) * (i + rng.random()) / s.mapping_points)
        points.append(measure(cut, budget))
        advance(len(points))
    for level in s.levels:
        for _ in range(s.refine_points):
            below, above = _bracket(points, level)
            if below is None or above is None:
                break
            budget = math.sqrt(below * above)
            points.append(measure(int(rng.integers(0, len(st.runner.cuts))), budget))
            advance(len(points))
    advance(total)  # refinement that found no bracket to split is done, not pending
    return points


def _bracket(points: list[AccuracyPoint], level: float) -> tuple[float | None, float | None]:
    """Predicted noise of the last point under ``level`` and of the first above it (envelope)."""
    below = above = None
    for p in sorted(points, key=lambda q: q.predicted_noise):
        if p.drop > level:
            above = p.predicted_noise
            break
        below = p.predicted_noise
    if below is not None and above is not None and above <= below:
        return None, None
    return below, above


def _additivity(points: list[AccuracyPoint]) -> dict[str, float]:
    rel = [abs(p.predicted_noise - p.noise) / p.noise for p in points if p.noise > 0]
    ratio = [p.predicted_noise / p.noise for p in points if p.noise > 0]
    return {"median_abs_rel_error": float(np.median(rel)), "max_abs_rel_error": float(np.max(rel)),
            "min_ratio_predicted_to_measured": float(np.min(ratio)),
            "max_ratio_predicted_to_measured": float(np.max(ratio)), "points": float(len(rel))}


def _tables(runner: ModelRunner, data: Data, s: CalibrationSettings, progress: ProgressSink,
            ck: Checkpoints) -> tuple[Tables, dict[str, float], dict[str, object]]:
    """Noise tables of the configured estimator (and the other one, to compare and time), from
    the checkpoint when a killed job measured them."""
    saved = ck.load("tables")
    if saved is not None:
        weight, activation = saved["tables"]
        return (weight, activation), saved["timing"], saved["agreement"]
    found = _measure_tables(runner, data, s, progress)
    ck.save("tables", {"tables": list(found[0]), "timing": found[1], "agreement": found[2]})
    return found


def _measure_tables(runner: ModelRunner, data: Data, s: CalibrationSettings,
                    progress: ProgressSink) -> tuple[Tables, dict[str, float], dict[str, object]]:
    images = data.fit.images[: s.noise_samples]
    todo = {s.estimator} | ({Estimator.FAST, Estimator.DIRECT} if s.measure_both else set())
    tables: dict[Estimator, Tables] = {}
    timing: dict[str, float] = {}
    for est in sorted(todo):
        steps = ((len(runner.tensors) + len(runner.cuts) - 1) * len(BITS) if est is Estimator.DIRECT
                 else math.ceil(len(images) / runner.batch_size))
        advance = progress.start(f"noise tables ({est.value})", steps)
        if est is Estimator.DIRECT:
            tables[est], timing[est.value] = timed(partial(direct_tables, runner, images, advance))
        else:
            tables[est], timing[est.value] = timed(
                partial(fast_tables, runner, images, s.probes, s.seed, advance))
    agreement: dict[str, object] = {}
    if len(tables) == 2:
        fast_w, fast_a = tables[Estimator.FAST]
        dir_w, dir_a = tables[Estimator.DIRECT]
        ratios = {name: _ratios(fast_w[name], dir_w[name]) for name in dir_w}
        ratios.update({f"cut{k}": _ratios(fast_a[k], dir_a[k]) for k in dir_a})
        agreement = {"fast_over_direct_by_bits": ratios, "bits": list(BITS),
                     "direct_tables": {"weights": dir_w, "activations": dir_a},
                     "fast_tables": {"weights": fast_w, "activations": fast_a}}
    return tables[s.estimator], timing, agreement


def _ratios(fast: list[float], direct: list[float]) -> list[float]:
    return [f / d if d > 0 else float("nan") for f, d in zip(fast, direct, strict=True)]


def _checked(spec: ModelSpec, settings: CalibrationSettings, sources: Sources,
             logits: int) -> tuple[CalibrationSettings, Sources]:
    """The settings with the sample counts resolved from the data's size and the levels checked
    (``offline.sizing``), and the sources in the card's class order: from the sources' lengths and
    class names, before a sample is decoded. What the job runs, checkpoints and records."""
    if get_metric(settings.metric).needs_labels:  # a label-free metric ignores the data's classes
        sources = align_labels(spec, sources, settings.labels)
    check_model_fits(spec, sources, logits, settings.metric)
    check_metric_fits(sources, settings.metric)
    return size_job(settings, len(sources.calibration), sources.calibration.describe().location), sources


def calibrate(spec: ModelSpec, settings: CalibrationSettings, out_dir: Path,
              progress: ProgressSink | None = None, sources: Sources | None = None, *,
              fresh: bool = False, executor: Executor | None = None) -> CalibrationArtifact:
    """Run the whole job for one model and write ``artifact.json``, ``validation.json``, the report.

    ``sources`` default to those the settings name (:func:`offline.data.open_sources`). Data that
    cannot be used (overlapping or mismatched sources, classes that are not one per logit) is
    refused before anything is written, and so are sample counts the calibration source cannot
    hold and levels its check samples cannot certify (``offline.sizing``; the counts not given
    come from its size). Each stage's results are checkpointed in
    ``out_dir/checkpoint`` (:mod:`offline.checkpoint`): the same job run again resumes from them
    and writes the same ``artifact.json``; ``fresh`` discards them first. ``artifact.json`` is
    written last, whole, and the checkpoints are removed after it. ``executor`` runs the
    validation stage elsewhere (``offline.ray_executor``); the artifact is the same.

    Raises:
        CheckpointMismatchError: ``out_dir`` holds checkpoints of other inputs (and not ``fresh``).
        CalibrationOutputError: ``out_dir`` cannot be written; its checkpoints stay resumable.
    """
    sink = progress or _Silent()
    started = time.perf_counter()
    keep_freed_memory()
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    model = spec.load()
    runner = ModelRunner(model, spec.input_shape, batch_size=settings.batch_size,
                         largest_group=settings.activation_group, device=settings.device)
    settings, sources = _checked(spec, settings, sources or open_sources(spec, settings),
                                 runner.cuts[-1].numel)
    if isinstance(settings.cuts, tuple):
        check_named_cuts(settings.cuts, len(runner.cuts))  # before anything is written
    inputs = job_inputs(spec, settings, sources)
    check_writable(out_dir)
    if not fresh:
        Checkpoints.refuse_other_inputs(out_dir, inputs)
    # workers from the cuts the job may calibrate at most: the same for any choice (float rounding)
    workers = resolve_workers(settings, len({0, *settings.cuts}) if isinstance(settings.cuts, tuple)
                              else len(runner.cuts))
    processes = 1 + workers if workers > 1 and executor is None else 1
    # one copy of the samples per process: the job's and each local validation worker's; an image
    # that fails to decode is refused here, before anything is written to out_dir
    with held_samples(runner, settings, sources, processes, sink.start) as data:
        ck = Checkpoints.open(out_dir, inputs, fresh=fresh)
        st = State(runner, data, settings)
        stages: dict[str, float] = {}

        def lap(stage: str) -> None:  # the seconds since the previous stage ended
            stages[stage] = time.perf_counter() - started - sum(stages.values())

        lap("prepare")
        tables, timing, agreement = _tables(runner, data, settings, sink, ck)
        lap("tables")
        st.items = _items(runner, tables, settings)
        points = _mapping(st, sink, ck)
        lap("mapping")
        budgets = {str(a): budget_for_level(points, a) for a in settings.levels}
        profiles = runner.cut_profiles(spec.input_shape)
        lap("cut_profiles")
        choice = decide_cuts(st, profiles, budgets, sink.start, ck)
        cuts = choice.calibrated
        lap("cut_choice")
        records = {c: r for c in cuts if (r := ck.load(f"cut-{c}")) is not None}
        patterns, baseline = all_patterns(
            spec, st, cuts, Plan(budgets, points), workers,
            sink.start("validate + test patterns", len(cuts) * (len(settings.levels) + 1)),
            records, lambda cut, rec: ck.save(f"cut-{cut}", rec), executor)
        lap("validation")
        ratios = _coding(runner, data, sink, ck)
        lap("coding")
        if (ladder := job_ladder(spec, sources, settings, sink.start, ck.load, ck.save)) is not None:
            lap("images")
        timing.update({f"stage_{name}": seconds for name, seconds in stages.items()})
        timing["total_without_report"] = time.perf_counter() - started
        timing.update(peak_rss_mib())
        artifact = CalibrationArtifact(
            model=spec.name, version=_version(spec), factory=spec.factory,
            input_shape=list(spec.input_shape), weights_sha256=_sha256(spec.weights),
            fp32_test_accuracy=data.test_accuracy,
            splits=splits(sources, settings), data=data_record(sources, data, settings),
            settings={**json.loads(settings.model_dump_json(exclude=settings.execution_only)),
                      "workers": workers},
            tensors=[WeightTensor(name=t.name, shape=list(t.shape), params=t.params, channels=t.shape[0])
                     for t in runner.tensors],
            cuts=profiles,
            weight_noise=tables[0], activation_noise=tables[1], noise_budgets=budgets,
            accuracy_points=points, additivity_error=_additivity(points), patterns=patterns,
            baseline_qpart_paper=baseline, timing_s=timing, promise=make_promise(settings),
            image_ladder=ladder, lossless_levels=list(lossless_levels(settings)), cut_choice=choice)
        artifact = with_coding_ratios(artifact, ratios)
        _write(spec, artifact, agreement, out_dir, ck)
        return artifact


def _coding(runner: ModelRunner, data: Data, sink: ProgressSink, ck: Checkpoints) -> CodingRatios:
    saved = ck.load("coding")
    if saved is not None:
        return {Coding(c): [{int(b): r for b, r in per_bits.items()} for per_bits in per_cut]
                for c, per_cut in saved.items()}
    advance = sink.start("upload coding", len(runner.cuts))
    ratios = coding_ratios(runner, data.fit.images[:CODING_SAMPLES], advance)
    ck.save("coding", {c.value: per_cut for c, per_cut in ratios.items()})
    return ratios


def _write(spec: ModelSpec, artifact: CalibrationArtifact, agreement: dict[str, object], out_dir: Path,
           ck: Checkpoints) -> None:
    """The weights, the report, ``validation.json``, ``timing.json``, then ``artifact.json``; then
    the checkpoints go (a job killed before that resumes with nothing left to compute)."""
    from qpart.offline.report import write_outputs  # noqa: PLC0415 (matplotlib only when writing)

    try:
        # The artifact folder is self-contained: the server loads these exact weights (sha256-checked).
        target, tmp = out_dir / "weights.safetensors", out_dir / "weights.safetensors.tmp"
        if not (target.is_file() and _sha256(target) == artifact.weights_sha256):  # a resume: already there
            try:
                shutil.copyfile(spec.weights, tmp)
            except OSError as exc:  # copyfile names the source; the write that failed is tmp's
                raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
            tmp.replace(target)
        write_outputs(artifact, agreement, out_dir)
    except OSError as exc:
        (out_dir / "weights.safetensors.tmp").unlink(missing_ok=True)
        raise output_error(f"write the results into {out_dir}", exc, ck.folder) from exc
    ck.remove()


def job_inputs(spec: ModelSpec, settings: CalibrationSettings, sources: Sources) -> dict[str, Any]:
    """What a job's results depend on, as its checkpoints record it (``inputs.json``)."""
    return {
        "model": {"name": spec.name, "factory": spec.factory, "input_shape": list(spec.input_shape),
                  "weights_sha256": _sha256(spec.weights), "card": spec.card},
        "data": {"calibration": sources.calibration.describe().model_dump(mode="json"),
                 "test": sources.test.describe().model_dump(mode="json"), "order": sources.order},
        "settings": json.loads(settings.model_dump_json(exclude=settings.execution_only)),
        # the cut choice prices the shipped device profiles (files, not code): a resumed job's choice
        # must have been made with the same ones
        "devices": ({d.name: d.model_dump(mode="json") for d in builtin_devices().values()}
                    if settings.cuts == "auto" else {}),
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "code_sha256": _code_sha256()},
    }


def _code_sha256() -> str:
    """sha256 over the calibration's own source files (``offline``, ``kernels`` with its C
    quantizer, ``models``, ``profiles``): a job resumed by other code could mix two procedures'
    results."""
    import qpart.kernels  # noqa: PLC0415
    import qpart.models  # noqa: PLC0415
    import qpart.offline  # noqa: PLC0415
    import qpart.profiles  # noqa: PLC0415

    hasher = hashlib.sha256()
    for package in (qpart.offline, qpart.kernels, qpart.models, qpart.profiles):
        root = Path(next(iter(package.__path__)))
        for file in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c")):
            hasher.update(f"{file.relative_to(root.parent)}\n".encode())
            hasher.update(file.read_bytes())
    return hasher.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(spec: ModelSpec) -> str:
    return _sha256(spec.weights)[:12]
