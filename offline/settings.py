"""Settings of the calibration job (``QPART_CALIB_*`` environment variables or CLI options)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, JsonValue, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from qpart.models.metrics import DEFAULT_METRIC, METRICS
from qpart.offline.errors import CalibrationConfigError
from qpart.profiles.devices import builtin_devices

DEFAULT_LEVELS = (0.001, 0.0025, 0.005, 0.01, 0.02)
LADDER = (-4, -2, -1, 0, 1, 2, 3)
ADVANCED: dict[str, JsonValue] = {"advanced": True}
"""A setting's ``json_schema_extra`` when it is one of the job's internals, for those tuning the
method rather than running it: shown apart in docs/configuration.md and ``qpart calibrate --help``."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is a number (no infinity or NaN: a price of those would price every plan alike)."""

CutSelection = Literal["auto", "all"] | tuple[int, ...]
"""Which cuts a job calibrates (``offline.pruning``): auto (the envelope's), all, or these indices."""

SampleOrder = Literal["source", "digest"]
"""The order the fit, check and test samples are taken in. ``source``: the source's own order.
``digest``: by the sha256 of each preprocessed float32 sample, whatever the files' names and
classes (``offline.data``)."""


class Estimator(StrEnum):
    """Which noise tables drive the allocation."""

    FAST = "fast"
    """First-order estimate from random-probe backward passes (all tensors at once)."""
    DIRECT = "direct"
    """Quantize one tensor at a time and measure the logit noise (QPART / Zhou et al.)."""


class CalibrationSettings(BaseSettings):
    """How the calibration job samples, measures, allocates and validates.

    The settings marked :data:`ADVANCED` tune the method; the others say what to calibrate on and how
    to run it.
    """

    model_config = SettingsConfigDict(env_prefix="QPART_CALIB_", frozen=True)

    levels: tuple[float, ...] = Field(DEFAULT_LEVELS, description="Accuracy levels (max top-1 drop).")
    fit_samples: int | None = Field(None, ge=100, description=(
        "Calibration samples for tables and mapping; none: from the data's size (4000 from 10,000 "
        "samples up, else 40%: offline.sizing)."))
    check_samples: int | None = Field(None, ge=100, description=(
        "Calibration samples for validation bounds; none: from the data's size (6000 from 10,000 "
        "samples up, else the rest: offline.sizing). Each level needs enough of them "
        "(docs/guide/how-much-data.md)."))
    noise_samples: int = Field(2000, ge=50, description=(
        "Fit samples used for the noise tables (at most the fit samples: the job uses fewer when "
        "there are fewer, and records the count it used)."))
    uncertified: Literal["refuse", "lossless"] = Field("refuse", description=(
        "A level the check samples cannot certify even with no sample lost: refuse the job before its "
        "expensive stages, or keep the level lossless (float32 patterns, untested; said in the summary, "
        "the report, the artifact and qpart models)."))
    labels: Literal["check", "map"] = Field("check", description=(
        "The card's labels against the data's classes: check (refuse the same names in another "
        "order), or map (renumber the data's classes into the card's order)."))
    probes: int = Field(2, ge=1, le=64, json_schema_extra=ADVANCED, description=(
        "Random probes per sample for the fast estimator."))
    estimator: Estimator = Field(Estimator.FAST, json_schema_extra=ADVANCED, description=(
        "Tables that drive the allocation."))
    measure_both: bool = Field(False, json_schema_extra=ADVANCED, description=(
        "Also build the other estimator's tables and compare them (validation.json): research "
        "evidence, not used by the artifact."))
    min_bits: int = Field(2, ge=1, le=8, json_schema_extra=ADVANCED, description=(
        "Fewest bits the allocation gives a weight tensor or an activation."))
    max_bits: int = Field(8, ge=1, le=8, json_schema_extra=ADVANCED, description=(
        "Most bits the allocation gives a weight tensor or an activation."))
    activation_group: int = Field(256, ge=1, json_schema_extra=ADVANCED, description=(
        "Largest activation group size."))
    metric: str = Field(DEFAULT_METRIC, description=(
        "What a level bounds (qpart.models.metrics): " + "; ".join(
            f"{m.name}, the {m.short}" + ("" if m.needs_labels else " (needs no labels)")
            for m in METRICS.values()) + "."))
    confidence: float = Field(0.95, gt=0.5, lt=1, description=(
        "1 − δ: each pattern keeps its level with at least this probability over the check samples."))
    bound: Literal["exact", "newcombe"] = Field("exact", json_schema_extra=ADVANCED, description=(
        "Upper-bound method (validation)."))
    budget_units: int = Field(2000, ge=50, le=100_000, json_schema_extra=ADVANCED, description=(
        "DP discretisation of the budget."))
    mapping_points: int = Field(40, ge=4, json_schema_extra=ADVANCED, description=(
        "Mixed patterns on a log grid for the mapping."))
    refine_points: int = Field(3, ge=0, le=20, json_schema_extra=ADVANCED, description=(
        "Extra points per level where drop crosses it."))
    ladder_steps: int = Field(4, ge=1, le=16, json_schema_extra=ADVANCED, description=(
        "Ladder grid: noise budgets 2^(k/steps)."))
    ladder: tuple[int, ...] = Field(LADDER, json_schema_extra=ADVANCED, description=(
        "Rungs, in grid steps from the largest budget that passes on the fit samples."))
    search_octaves: int = Field(14, ge=1, le=40, json_schema_extra=ADVANCED, description=(
        "Octaves the fit search may go from D(a)."))
    seed: int = Field(0, description="Seed of the fast estimator's random probes and of the mapping.")
    threads: int = Field(2, ge=1, description="torch threads the job uses in all (fixed: results).")
    workers: int = Field(0, ge=0, le=256, description=(
        "Processes for the validation stage, one cut at a time each, sharing the threads (0: one "
        "per thread, at most one per cut; not the machine's cores, since the split can change rounding)."))
    batch_size: int = Field(500, ge=1, description=(
        "Samples per forward pass; lower it for large inputs to bound the job's memory "
        "(docs/data-sources.md)."))
    device: Literal["cpu", "cuda"] = Field("cpu", description=(
        "Where the model runs: cpu, or cuda (a GPU, with a CUDA build of torch; results differ from "
        "cpu's in float rounding, so the artifact records it)."))
    spill_above_mb: int = Field(2048, ge=0, json_schema_extra=ADVANCED, description=(
        "Hold the fit, check and test samples in memory while their copies (one per process: the job "
        "and each validation worker) take up to this many MB; above it, in files under the system's "
        "temporary folder (TMPDIR), mapped into memory, so the job's memory stays bounded (0: always "
        "in files). Changes no result."))
    cuts: Annotated[CutSelection, NoDecode] = Field("auto", description=(
        "Which cuts to calibrate: auto, the cuts a plan could choose (each cut's predicted patterns priced "
        "over the envelope_* requests; the others are pruned, and the artifact says why); all, every "
        "legal cut; or indices, comma-separated (e.g. 0,7,12). Cut 0, the all-server plan, always."))
    envelope_margin: float = Field(0.02, ge=0, le=10, allow_inf_nan=False, json_schema_extra=ADVANCED,
                                   description=(
        "cuts auto: a cut is calibrated when its cheapest predicted plan is within this fraction of the "
        "best plan's objective for some request of the envelope (docs/guide/cut-pruning.md)."))
    envelope_devices: tuple[str, ...] = Field((), json_schema_extra=ADVANCED, description=(
        "cuts auto: the shipped device profiles the envelope prices (empty: all of them)."))
    envelope_speeds: tuple[Finite, ...] = Field((0.1, 0.3, 1.0, 3.0, 10.0), min_length=1,
                                               json_schema_extra=ADVANCED, description=(
        "cuts auto: each device's FLOP/s times each of these."))
    envelope_rates_mbps: tuple[Finite, Finite] = Field((0.1, 1000.0), json_schema_extra=ADVANCED,
                                                       description=(
        "cuts auto: the lowest and highest link rate, Mbit/s."))
    envelope_rate_points: int = Field(17, ge=1, le=1000, json_schema_extra=ADVANCED, description=(
        "cuts auto: link rates priced, evenly spaced on a log scale between the two."))
    envelope_server_flops: tuple[Finite, ...] = Field((1e10,), min_length=1, json_schema_extra=ADVANCED,
                                                     description=(
        "cuts auto: the server's FLOP/s running a tail, each priced (a tail's FLOPs over it); 1e10 is "
        "between what this project's reference models' whole tails reach on a 2-core Xeon (4e9-3e10)."))
    envelope_price: float = Field(1.0, ge=0, allow_inf_nan=False, json_schema_extra=ADVANCED,
                                  description=(
        "cuts auto: the server's price per second of tail compute (the server's price_per_second)."))
    envelope_probe_samples: int = Field(1000, ge=100, json_schema_extra=ADVANCED, description=(
        "cuts auto: fit samples each predicted pattern is tested on (offline.selection.predicted_bits)."))
    measure_test: bool = Field(True, description="Measure every pattern once on the test split.")
    baseline: bool = Field(False, description=(
        "Also evaluate QPART as published on the test split, for each calibrated (cut, level): "
        "evidence for this project's benchmarks, which turn it on; a served artifact needs none."))
    image_qualities: tuple[int, ...] = Field((95, 90, 80, 75, 60, 50), description=(
        "The lossy input-image plan's WebP qualities (ADR 0015), tested from the highest down; empty: "
        "no ladder. Measured only where the card declares preprocessing and the data holds images."))
    test_samples: int | None = Field(None, ge=100, description="Limit the test split (default: all).")
    data: str = Field("fashion-mnist", min_length=1, description=(
        "Calibration source: fashion-mnist (its calibration split), fashion-mnist:<split>, an ImageFolder "
        "path (preprocessed by the model card's spec), or an .npz/.safetensors file of tensors."))
    test_data: str | None = Field(None, min_length=1, description=(
        "Test source, named as for data (default: fashion-mnist's test split when data is fashion-mnist)."))
    test_fraction: float | None = Field(None, gt=0, lt=1, description=(
        "Split the calibration source instead: this fraction of it, drawn with split_seed, is the test."))
    split_seed: int = Field(0, description="Seed of the test_fraction split.")
    sample_order: SampleOrder | None = Field(None, description=(
        "Order fit/check/test samples are taken in: source, or digest (by each preprocessed sample's "
        "sha256); default source for fashion-mnist, digest otherwise."))

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in METRICS:
            raise ValueError(f"{metric!r} is not a metric; known: {', '.join(METRICS)}")
        return metric

    @field_validator("cuts", mode="before")
    @classmethod
    def _cut_list(cls, cuts: object) -> object:
        if not isinstance(cuts, str):
            return cuts
        text = cuts.strip()
        if text.lower() in ("auto", "all"):
            return text.lower()
        if text.startswith("[") and text.endswith("]"):  # a JSON list, as other lists are given
            text = text[1:-1]
        try:
            return tuple(int(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"cuts {cuts!r}: give auto, all, or cut indices separated by commas, "
                             "e.g. 0,7,12") from None

    @field_validator("cuts")
    @classmethod
    def _cuts_named(cls, cuts: CutSelection) -> CutSelection:
        if isinstance(cuts, tuple):
            if not cuts:
                raise ValueError("cuts: name at least one cut index, or give auto or all")
            return tuple(sorted(set(cuts)))
        return cuts

    @field_validator("envelope_devices")
    @classmethod
    def _shipped_devices(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        shipped = builtin_devices()
        unknown = sorted(set(names) - shipped.keys())
        if unknown:
            raise ValueError(f"envelope_devices names {', '.join(unknown)}, not a shipped device profile; "
                             f"known: {', '.join(sorted(shipped))}")
        return names

    @field_validator("envelope_rates_mbps")
    @classmethod
    def _rates_in_order(cls, rates: tuple[float, float]) -> tuple[float, float]:
        if not 0 < rates[0] <= rates[1]:
            raise ValueError("envelope_rates_mbps: two positive rates, lowest first, e.g. [0.1, 1000]")
        return rates

    @model_validator(mode="after")
    def _rates_spanned(self) -> CalibrationSettings:
        lo, hi = self.envelope_rates_mbps
        if self.envelope_rate_points == 1 and lo != hi:
            raise ValueError(f"envelope_rate_points 1 prices one rate, but envelope_rates_mbps spans {lo:g} "
                             f"to {hi:g}: give 2 points or more, or the same rate twice")
        return self

    @field_validator("envelope_speeds", "envelope_server_flops")
    @classmethod
    def _positive(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if any(not v > 0 for v in values):
            raise ValueError("give positive numbers")
        return values

    @field_validator("levels")
    @classmethod
    def _levels_in_range(cls, levels: tuple[float, ...]) -> tuple[float, ...]:
        if not levels or any(not 0 < a < 1 for a in levels):
            raise ValueError("levels must be fractions in (0, 1), e.g. 0.01 for 1%")
        return tuple(sorted(set(levels)))

    @field_validator("ladder")
    @classmethod
    def _ladder_in_order(cls, ladder: tuple[int, ...]) -> tuple[int, ...]:
        if not ladder:
            raise ValueError("the ladder needs at least one rung, e.g. [-4, -2, -1, 0, 1, 2, 3]")
        return tuple(sorted(set(ladder)))

    @field_validator("image_qualities")
    @classmethod
    def _qualities_in_order(cls, qualities: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 1 <= q <= 100 for q in qualities):
            raise ValueError("WebP qualities are 1 to 100, e.g. [95, 90, 75]")
        return tuple(sorted(set(qualities), reverse=True))

    @property
    def execution_only(self) -> set[str]:
        """Settings that change how the job runs, never its results: left out of the inputs its
        checkpoints must match, so a resumed job may change them."""
        return {"spill_above_mb"}

    @property
    def fit_count(self) -> int:
        """``fit_samples`` once the job has resolved it from the data (``offline.sizing``).

        Raises:
            CalibrationConfigError: not resolved yet (a caller's mistake: resolve the settings first).
        """
        return _resolved(self.fit_samples, "fit_samples")

    @property
    def paired(self) -> bool:
        """Whether the metric's bound is paired (gains offset losses) or one-sample."""
        return METRICS[self.metric].paired

    @property
    def check_count(self) -> int:
        """``check_samples`` once the job has resolved it from the data (``offline.sizing``)."""
        return _resolved(self.check_samples, "check_samples")

    @property
    def delta(self) -> float:
        """δ: the chance a pattern's promise is wrong (1 − confidence)."""
        return round(1.0 - self.confidence, 12)


def _resolved(value: int | None, name: str) -> int:
    if value is None:
        raise CalibrationConfigError(f"{name} is not resolved from the data's size yet "
                                     "(offline.sizing.resolve_samples)")
    return value
