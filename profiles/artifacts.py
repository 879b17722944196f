"""The calibration artifact: the versioned contract between the calibration job and the server.

One artifact describes one (model, version): its cuts with sizes, FLOPs and serving-machine
latencies, the measured noise tables, the accuracy-to-noise mapping, and one validated bit pattern
per (cut, accuracy level). ``offline`` writes it, ``server`` reads it; nothing else is shared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpart.kernels.coding import Coding
from qpart.kernels.onnx_format import HeadRuntime
from qpart.profiles.cut_choice import CutChoice
from qpart.profiles.errors import ProfileFormatError, ProfileNotFoundError, SchemaVersionError

ARTIFACT_SCHEMA_VERSION = 8
"""8: which cuts were calibrated and why the others were not (``cut_choice``, ADR 0025; None
before: every cut with patterns was). 7: what every level bounds (``promise.metric``,
qpart.models.metrics: top1-drop before it was recorded) and each pattern's share of test samples
whose top-1 differs from the float model's (``test_disagreement``, the reference a live audit
compares with; None before).
6: the levels the check samples could not certify, kept lossless at the user's request
(``lossless_levels``; empty when calibrated before). 5: what was measured on the calibrating
machine, not decided by the calibration (each cut's
``server_head_s``/``server_tail_s`` and ``timing_s``), is kept in ``timing.json`` beside
``artifact.json``, so that ``artifact.json`` is a function of the model, the data and the settings
alone (a resumed job writes it byte for byte; ``docs/calibration-resume.md``).
4: the records of the calibration and test data (``data``: each source's kind, location,
count, classes, content digest, preprocessing and split; None when calibrated before). 3: the
promise a calibration makes (``promise``) and each pattern's ladder (``rungs``,
``passed``) in place of ``tightenings`` (ADR 0011). 2: a cut's upload-coding ratios in one map
keyed by :class:`~kernels.coding.Coding`; schema 1 had a field per coding (ADR 0008). Older
artifacts are upgraded as they load."""
ARTIFACT_FILE = "artifact.json"
TIMING_FILE = "timing.json"
_MEASURED_CUT_FIELDS = ("server_head_s", "server_tail_s")
FLOAT_BITS = 32
"""Bit width that means "not quantized, sent as float32"."""

Bits = Annotated[int, Field(ge=1, le=32)]
Ratio = Annotated[float, Field(gt=0, le=2)]
_SCHEMA1_RATIOS = {"deflate_ratio": Coding.DEFLATE, "zstd_ratio": Coding.ZSTD}  # schema 1's fields


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightTensor(_Frozen):
    """A quantizable weight tensor (per-output-channel scales)."""

    name: str
    shape: list[int]
    params: int = Field(ge=1)
    channels: int = Field(ge=1)


class CutProfile(_Frozen):
    """One legal cut of the model."""

    index: int = Field(ge=0)
    node: str
    activation_shape: list[int]
    activation_numel: int = Field(ge=1)
    head_tensors: list[str] = Field(description="Quantizable weight tensors of the head.")
    head_float_params: int = Field(ge=0, description="Head parameters always sent as float32 (biases).")
    head_flops: int = Field(ge=0)
    tail_flops: int = Field(ge=0)
    server_head_s: float = Field(0.0, ge=0, description=(
        "Head time, batch 1, on the machine that calibrated (kept in timing.json; 0: not measured)."))
    server_tail_s: float = Field(0.0, ge=0, description=(
        "Tail time, batch 1, on the machine that calibrated (kept in timing.json; 0: not measured). "
        "The server measures its own at start-up; this stands in before."))
    runtimes_refused: dict[str, str] = Field(default_factory=dict, description=(
        "Device runtimes (torch, onnx) that cannot run this cut's head, each with why; checked at "
        "calibration (models.runtimes). Plans for such a runtime never offer the cut. Empty: every "
        "runtime; an artifact from before the check has none recorded."))
    coding_ratio: dict[Coding, dict[Bits, Ratio]] = Field(
        default_factory=dict,
        description="Per upload coding (kernels.coding), per activation bits (1..8, 32): mean coded "
                    "size of this cut's activation packet over its raw size, on calibration samples. "
                    "A coding absent: not measured; uploads are not priced in it.")

    def with_coding_ratios(self, ratios: Mapping[Coding, Mapping[int, float]]) -> CutProfile:
        """A copy holding ``ratios`` (coding -> ratio per bits) in place of those codings' own; an
        empty mapping removes the coding (not measured)."""
        merged = {**self.coding_ratio, **{c: dict(r) for c, r in ratios.items()}}
        return self.model_copy(update={"coding_ratio": {c: r for c, r in merged.items() if r}})


class Pattern(_Frozen):
    """Bits for every head weight tensor and for the activation at the cut, for one accuracy level."""

    pattern_id: str
    cut: int = Field(ge=0)
    level: float = Field(ge=0, le=1, description=(
        "Promised bound on the artifact's metric (promise.metric; top-1 drop when none), a fraction; "
        "0 = lossless."))
    weight_bits: dict[str, Bits]
    activation_bits: Bits
    group_size: int = Field(ge=1)
    predicted_noise: float = Field(ge=0)
    predicted_drop: float
    calib_drop: float | None = Field(description="Measured drop on the calibration check samples.")
    calib_drop_ub: float | None = Field(
        description="One-sided upper confidence bound of the drop on the check samples."
    )
    test_drop: float | None = Field(description="Measured once on the test split, in the artifact's metric.")
    test_disagreement: float | None = Field(None, description=(
        "Share of the test split whose top-1 differs from the float model's, from the same run as "
        "test_drop (the reference a live audit compares with); None: not measured (before schema 7)."))
    weight_bytes: int = Field(ge=0, description="Head segment payload: codes + scales + float params.")
    fp32_weight_bytes: int = Field(ge=0)
    activation_bytes: int = Field(ge=0, description="Uploaded activation payload per sample.")
    rungs: int | None = Field(None, ge=0, description="Candidates in this (cut, level)'s ladder.")
    passed: int | None = Field(
        None, ge=0, description="Rungs that passed on the check samples before the first failure "
                                "(this pattern has the fewest bits of them; 0: lossless).")


class ImageRung(_Frozen):
    """One quality of the lossy input-image plan (ADR 0015), measured on the check samples and the
    test split as a pattern is (``offline.image_ladder``)."""

    codec: Literal["webp"] = Field(description="The codec (models.image_codecs).")
    quality: int = Field(ge=1, le=100, description="The encoder's quality setting.")
    levels: list[float] = Field(description="The levels it is promised at (fixed-sequence test passed); "
                                "empty: none.")
    calib_drop: float = Field(description="Measured drop on the check samples.")
    calib_drop_ub: float = Field(description="Its one-sided upper confidence bound (the promise's test).")
    test_drop: float | None = Field(description="Measured once on the test split (None: not promised, "
                                    "not measured).")
    mean_bytes: float = Field(ge=0, description="Mean encoded size on the check samples.")

    @property
    def level(self) -> float | None:
        """The tightest level it is promised at (None: none)."""
        return min(self.levels, default=None)


class ImageLadder(_Frozen):
    """The lossy input-image plan's qualities and what backs them (ADR 0015)."""

    statement: str = Field(description="The promise in one sentence.")
    encoder: str = Field(description="The encoder measured (the promise holds for its bytes).")
    check_samples: int = Field(ge=1)
    test_samples: int = Field(ge=1)
    rungs: list[ImageRung] = Field(description="Most conservative (highest quality) first, as tested.")


class Promise(_Frozen):
    """What every pattern's level means, and what backs it (``offline.ltt``)."""

    statement: str = Field(description="The promise in one sentence, naming all of the below.")
    metric: str = Field("top1-drop", description=(
        "What every level bounds, a metric of qpart.models.metrics (e.g. top1-drop, top1-agreement); "
        "calibrated before the metric was recorded: top1-drop, the only one there was."))
    delta: float = Field(gt=0, lt=0.5, description="δ: the chance a pattern's promise is wrong.")
    bound: str = Field(description="Upper-bound method of the test (offline.validation).")
    check_samples: int = Field(ge=1, description="Calibration samples the test reads, once.")
    ladder: str = Field(description="How each (cut, level)'s candidates were fixed and tested.")


class DataRecord(_Frozen):
    """One data source as the calibration read it (``models.sources.SourceRecord`` as JSON)."""

    kind: str = Field(description="image-folder, arrays or fashion-mnist.")
    location: str = Field(description="Where it was read from (a path, or fashion-mnist:<split>@<folder>).")
    count: int = Field(ge=1, description="Samples in the source.")
    classes: list[str] = Field(description="Class names; a label is an index into them.")
    sample_shape: list[int] = Field(description="(C, H, W) of every sample.")
    content_sha256: str = Field(description="sha256 over the class names, sample digests and labels.")
    preprocess: dict[str, Any] | None = Field(None, description="How images became tensors.")
    split: dict[str, Any] | None = Field(None, description="Set when cut from a larger source by a split.")


class CalibrationData(_Frozen):
    """The data a calibration read and which of its samples each step used."""

    calibration: DataRecord
    test: DataRecord
    sample_order: Literal["source", "digest"] = Field(
        description="source: the sources' own order; digest: by each preprocessed sample's sha256.")
    fit_samples: int = Field(ge=1, description="The first samples of the calibration source, in that order.")
    check_samples: int = Field(ge=1, description="The next samples of the calibration source.")
    test_samples: int = Field(ge=1, description="The first samples of the test source, in that order.")


class AccuracyPoint(_Frozen):
    """One mixed pattern measured on the fit samples: total logit noise and top-1 drop."""

    noise: float
    predicted_noise: float
    drop: float


class CalibrationArtifact(_Frozen):
    """Everything the server needs to plan requests for one model version."""

    schema_version: Literal[8] = 8
    kind: Literal["qpart-calibration"] = "qpart-calibration"
    model: str
    version: str
    factory: str
    input_shape: list[int]
    weights_sha256: str
    fp32_test_accuracy: float | None = Field(description=(
        "The float model's top-1 accuracy on the test samples; None: they have no labels."))
    splits: dict[str, object]
    settings: dict[str, object]
    tensors: list[WeightTensor]
    cuts: list[CutProfile]
    weight_noise: dict[str, list[float]] = Field(description="E||dz||^2 per tensor for b = 1..8.")
    activation_noise: dict[str, list[float]] = Field(description="Per cut index, for b = 1..8.")
    noise_budgets: dict[str, float] = Field(description="Noise budget D(a) per level (str).")
    accuracy_points: list[AccuracyPoint]
    additivity_error: dict[str, float]
    patterns: list[Pattern]
    baseline_qpart_paper: list[Pattern]
    timing_s: dict[str, float] = Field(default_factory=dict, description=(
        "Seconds each stage took, and the job's peak RSS in MiB (peak_rss_mib_*) (kept in "
        "timing.json; empty: not recorded)."))
    promise: Promise | None = Field(
        None, description="None: calibrated before schema 3, by a search that backs no such statement.")
    data: CalibrationData | None = Field(
        None, description="None: calibrated before schema 4, on the Fashion-MNIST splits `splits` records.")
    image_ladder: ImageLadder | None = Field(
        None, description="The lossy input-image plan's qualities (ADR 0015); None: not measured (the "
        "card declares no preprocessing, or the data holds no images, or calibrated before it).")
    lossless_levels: list[float] = Field(default_factory=list, description=(
        "Levels the check samples could not certify even had no sample been lost, kept lossless at "
        "the user's request (qpart calibrate --uncertified lossless): their patterns are float32 and "
        "untested; a plan at such a demand sends float32. Empty: every level was certifiable."))
    cut_choice: CutChoice | None = Field(None, description=(
        "Which cuts were calibrated and why the others were not; None: calibrated before schema 8."))

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """An older document as schema 8. From 1: each cut's ``<coding>_ratio`` fields into its
        ``coding_ratio`` map (an empty one: not measured, left out). From 1 or 2: patterns lose
        ``tightenings`` (the search that counted them made no promise; ``promise`` stays None).
        From 1 to 3: ``data`` stays None (the Fashion-MNIST splits, recorded in ``splits``). From 4:
        nothing changes (its measurements are inline, where schema 5 still reads them). From 5:
        ``lossless_levels`` stays empty (the job refused no level; an uncertifiable one became
        lossless silently). From 6: its promise is in top1-drop, the only metric there was, and no
        pattern has a ``test_disagreement``. From 7: ``cut_choice`` stays None."""
        if not (isinstance(data, dict) and data.get("schema_version") in (1, 2, 3, 4, 5, 6, 7)):
            return data
        out = dict(data)
        if data["schema_version"] in (3, 4, 5, 6, 7):
            out["schema_version"] = ARTIFACT_SCHEMA_VERSION
            return out
        if data["schema_version"] == 1 and isinstance(data.get("cuts"), list):
            out["cuts"] = [_schema1_cut(c) if isinstance(c, dict) else c for c in data["cuts"]]
        for name in ("patterns", "baseline_qpart_paper"):
            if isinstance(data.get(name), list):
                out[name] = [_schema2_pattern(p) if isinstance(p, dict) else p for p in data[name]]
        out["schema_version"] = ARTIFACT_SCHEMA_VERSION
        return out

    @property
    def metric(self) -> str:
        """What every level bounds (``promise.metric``; top1-drop before the metric was recorded)."""
        return self.promise.metric if self.promise is not None else "top1-drop"

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationArtifact:
        names = {t.name for t in self.tensors}
        cut_ids = {c.index for c in self.cuts}
        for p in self.patterns:
            if p.cut not in cut_ids:
                raise ValueError(f"pattern {p.pattern_id} names unknown cut {p.cut}")
            if not set(p.weight_bits) <= names:
                raise ValueError(f"pattern {p.pattern_id} names unknown tensors")
        planned = {p.cut for p in self.patterns}
        if self.patterns and 0 not in planned:  # every plan answers beside the all-server one
            raise ValueError("no pattern at cut 0, the all-server plan: calibrate again (cut 0 always is)")
        if self.cut_choice is not None and not set(self.cut_choice.calibrated) <= planned:
            raise ValueError(f"cut_choice names {self.cut_choice.calibrated}; patterns: {sorted(planned)}")
        return self

    @property
    def calibrated_cuts(self) -> list[int]:
        """The cuts that have patterns, in order (``cut_choice`` says why the others have none)."""
        return sorted({p.cut for p in self.patterns})

    def pattern(self, pattern_id: str) -> Pattern | None:
        """The pattern with this id, if any."""
        return next((p for p in self.patterns if p.pattern_id == pattern_id), None)

    def runtime_table(self) -> dict[str, dict[str, object]]:
        """Per device runtime, the cuts calibration found it can run (``cuts``: cut 0 always) and
        why it cannot run the others (``refused``: cut, as a string, -> reason), from
        ``cuts[i].runtimes_refused`` (an artifact from before that check lists every cut)."""
        table: dict[str, dict[str, object]] = {}
        for runtime in HeadRuntime:
            refused = {str(i): c.runtimes_refused[runtime.value] for i, c in enumerate(self.cuts)
                       if i > 0 and runtime.value in c.runtimes_refused}
            table[runtime.value] = {"cuts": [i for i in range(len(self.cuts)) if str(i) not in refused],
                                    "refused": refused}
        return table


def _schema1_cut(cut: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in cut.items() if k not in _SCHEMA1_RATIOS}
    out["coding_ratio"] = {c.value: cut[k] for k, c in _SCHEMA1_RATIOS.items() if cut.get(k)}
    return out


def _schema2_pattern(pattern: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pattern.items() if k != "tightenings"}


def load_artifact(path: Path) -> CalibrationArtifact:
    """Read and validate an artifact (``DIR/artifact.json`` or the file itself), with the machine
    measurements of the ``timing.json`` beside it when there is one."""
    file = path / ARTIFACT_FILE if path.is_dir() else path
    try:
        raw = file.read_bytes()
    except FileNotFoundError as exc:
        raise ProfileNotFoundError(f"no calibration artifact at {file}") from exc
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"{file} is not a valid calibration artifact: not JSON ({exc})") from exc
    timing = file.with_name(TIMING_FILE)
    if isinstance(doc, dict) and timing.is_file():
        doc = _with_timing(doc, timing)
    try:
        return CalibrationArtifact.model_validate(doc)
    except ValidationError as exc:
        if any(e["loc"][:1] == ("schema_version",) for e in exc.errors()):
            raise SchemaVersionError(f"{file}: this build reads artifacts of schema_version 1 to "
                                     f"{ARTIFACT_SCHEMA_VERSION}; re-run qpart calibrate with it") from exc
        raise ProfileFormatError(f"{file} is not a valid calibration artifact: {exc}") from exc


def _with_timing(doc: dict[str, Any], file: Path) -> dict[str, Any]:
    """``doc`` with the stage seconds and per-cut latencies of ``timing.json``."""
    try:
        timing = json.loads(file.read_bytes())
        stages = dict(timing["timing_s"])
        measured = {int(c["index"]): {k: float(c[k]) for k in _MEASURED_CUT_FIELDS} for c in timing["cuts"]}
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ProfileFormatError(f"{file} is not a valid timing record: {exc}") from exc
    out = {**doc, "timing_s": stages}
    if isinstance(doc.get("cuts"), list):
        out["cuts"] = [{**c, **measured.get(c["index"], {})} if isinstance(c, dict) and "index" in c
                       else c for c in doc["cuts"]]
    return out


def timing_doc(artifact: CalibrationArtifact) -> dict[str, Any]:
    """The ``timing.json`` document: what this run measured on its machine."""
    return {"kind": "qpart-calibration-timing", "model": artifact.model, "version": artifact.version,
            "timing_s": artifact.timing_s,
            "cuts": [{"index": c.index, **{k: getattr(c, k) for k in _MEASURED_CUT_FIELDS}}
                     for c in artifact.cuts]}


def artifact_json(artifact: CalibrationArtifact) -> str:
    """``artifact.json``'s text: everything but the machine measurements (:func:`timing_doc`)."""
    exclude: Any = {"timing_s": True, "cuts": {"__all__": set(_MEASURED_CUT_FIELDS)}}
    return artifact.model_dump_json(indent=1, exclude=exclude) + "\n"


def save_artifact(artifact: CalibrationArtifact, directory: Path) -> Path:
    """Write ``DIR/timing.json``, then ``DIR/artifact.json``, each atomically (a temporary file
    renamed; one that cannot be written whole is removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / TIMING_FILE, json.dumps(timing_doc(artifact), indent=1) + "\n")
    file = directory / ARTIFACT_FILE
    write_atomic(file, artifact_json(artifact))
    return file


def write_atomic(file: Path, text: str) -> None:
    """``text`` into ``file`` by way of ``file.tmp``, flushed to disk, then renamed over it: a
    reader sees the old file or the new one, never part of one. Raises the ``OSError`` of a
    write that failed (a full disk), after removing the temporary file."""
    tmp = file.with_name(file.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(file)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
