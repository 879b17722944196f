"""Wire models of the HTTP API: planning, tail inference and the Open Inference Protocol (v2)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.profiles.costs import PRESET_WEIGHTS
from qpart.profiles.devices import DeviceProfile

SHA256_HEX = r"^[0-9a-f]{64}$"


def _integral(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer; strict mode alone would refuse it (and accept no bool)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]
"""An integer field that accepts integral JSON numbers such as ``5.0`` but never ``true``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class WeightPreset(StrEnum):
    """Named objective weights (ω time, τ energy, η server cost)."""

    LATENCY_FIRST = "latency-first"
    """ω = 1, τ = 0.05, η = 0.01: end-to-end time dominates."""
    ENERGY_FIRST = "energy-first"
    """ω = 0.05, τ = 1, η = 0.01: device energy dominates."""
    QPART_PAPER = "qpart-paper"
    """ω = τ = η = 1, the setting of QPART's simulation (Table II)."""


class ObjectiveWeights(_Strict):
    """Weights of the objective ``J = ω·T + τ·E + η·C``."""

    time: float = Field(1.0, ge=0, le=1e6, description="ω, per second of end-to-end time.")
    energy: float = Field(0.0, ge=0, le=1e6, description="τ, per joule of device energy.")
    cost: float = Field(0.0, ge=0, le=1e6, description="η, per unit of server cost.")


PRESETS: dict[WeightPreset, ObjectiveWeights] = {
    preset: ObjectiveWeights(time=w[0], energy=w[1], cost=w[2]) for preset in WeightPreset
    for w in [PRESET_WEIGHTS[preset.value]]}


MAX_IMAGE_SIDE = 1 << 16


class LossyImage(_Strict):
    """The same image as a WebP at a quality from the model's ``image_qualities`` (ADR 0015)."""

    quality: JsonInt = Field(ge=1, le=100, description="The WebP quality it was encoded at.")
    bytes: JsonInt = Field(ge=1, le=1 << 30, description="The WebP's size in bytes.")
    encode_s: float = Field(0.0, ge=0, le=60, description="Seconds the device took to encode it.")


class InputImage(_Strict):
    """The image the device holds, before any preprocessing, encoded as a PNG (ADR 0014) and,
    optionally, as lossy WebPs (ADR 0015)."""

    png_bytes: JsonInt = Field(ge=1, le=1 << 30, description="The PNG's size in bytes.")
    width: JsonInt = Field(ge=1, le=MAX_IMAGE_SIDE, description="The image's width in pixels.")
    height: JsonInt = Field(ge=1, le=MAX_IMAGE_SIDE, description="The image's height in pixels.")
    encode_s: float = Field(0.0, ge=0, le=60, description="Seconds the device took to encode it "
                            "(measured on the device; counted as its local time).")
    webp: list[LossyImage] = Field(
        default_factory=list, max_length=8, description="The image as WebPs too: each one whose "
        "quality the model's calibration promises at a level no looser than the demand is priced "
        "as the plan 'input-webp@<quality>' (ADR 0015).")


class PlanRequest(_Strict):
    """A device asks for a plan: which cut and which bits, under its accuracy demand."""

    model: str = Field(min_length=1, max_length=64, description="Registered model name.")
    version: str | None = Field(None, max_length=64, description="Model version (default: newest).")
    accuracy_demand: float = Field(ge=0, lt=1, description="Max accepted level in the model's metric "
                                   "(its promise.metric: top-1 drop by default), e.g. 0.01 for 1%.")
    rate_bps: float = Field(ge=1.0, le=1e12, description="Channel rate the device measured (bit/s).")
    device: Annotated[str, Field(max_length=64)] | DeviceProfile = Field(
        "raspberry-pi-4", description="A shipped device profile's name, or an inline profile.")
    weights: Annotated[WeightPreset, Strict(False)] | ObjectiveWeights = Field(
        WeightPreset.LATENCY_FIRST, description="A named preset or explicit objective weights.")
    deadline_s: float | None = Field(None, gt=0, le=3600, description="Max end-to-end time.")
    held_segments: list[Annotated[str, Field(pattern=SHA256_HEX)]] = Field(
        default_factory=list, max_length=256, description="Segment ids the device already caches.")
    batch: JsonInt = Field(1, ge=1, le=1024, description="Samples per inference with this plan.")
    rtt_s: float | None = Field(None, ge=0, le=10, description="Round-trip time (default: profile's).")
    upload_overlap_s: float = Field(
        0.0, ge=0, le=1, description="Seconds of an upload's body time that the server's request "
        "handling hides (it starts on the headers); measured by the device, default none.")
    upload_rate_bps: float | None = Field(
        None, ge=1.0, le=1e12, description="The marginal cost of the activation body's bytes, as a "
        "rate (bit/s), which may exceed rate_bps: measured by the device from uploads of two sizes "
        "(ADR 0006; default: rate_bps). Request headers, the coding's header, answers and segment "
        "downloads count at rate_bps. A device that measures this has no use for upload_overlap_s "
        "too: the overlap would discount the same body again.")
    upload_codings: list[Annotated[Coding, Strict(False)]] = Field(
        default_factory=list, max_length=len(Coding), description="Content-Encodings the device can "
        "send its activation packet with (kernels.coding). Each plan is then priced as is and in "
        "each of them where the calibration measured the cut's packets so coded and the device "
        "profile has the coding's times; the plan's upload_encoding says which won.")
    upload_deflate: bool = Field(
        False, description="The same as listing 'deflate' in upload_codings (kept for devices that "
        "predate zstd).")
    runtime: Annotated[HeadRuntime, Strict(False)] = Field(
        HeadRuntime.TORCH, description="What runs the head on the device, and so the form of the "
        "plan's segment: 'torch' (safetensors tensors for the device's own model code, ADR 0003) or "
        "'onnx' (the head's whole ONNX graph, its weights packed and dequantized in the graph, "
        "ADR 0012).")
    input_image: InputImage | None = Field(
        None, description="The device can upload its input image itself, as a PNG of this size, "
        "for the server to preprocess as the model card declares and run the whole model on "
        "(ADR 0014). The planner then prices that plan too (pattern 'input-png', cut 0, lossless) "
        "for a batch of 1, when the card declares preprocessing that takes such an image.")

    audit: bool = Field(
        False, description="The device consents to a live audit of this plan (ADR 0024): where the "
        "server marks it (QPART_AUDIT_RATE), the plan's 'audit' says where to upload the raw input "
        "after the answer. The expected extra upload is priced into the plan.")

    def offered_codings(self) -> frozenset[Coding]:
        """The codings the device offers, from both fields."""
        deflate = [Coding.DEFLATE] if self.upload_deflate else []
        return frozenset([*self.upload_codings, *deflate])


# How an activation packet is sent (server.tails.content): as is, or in an upload coding.
UploadEncoding = Literal["identity"] | Annotated[Coding, Strict(False)]


AUDIT_ID = r"^[A-Za-z0-9_-]{1,64}$"
"""What an audit id looks like (URL-safe base64 from ``secrets``)."""
AUDIT_HEADER = "Qpart-Audit"
"""The tail request's header that names the audit its answer belongs to."""
AUDIT_SAMPLE_HEADER = "Qpart-Audit-Sample"
"""The tail answer's header that names which of its samples (0-based) the device uploads."""


class AuditTicket(_Strict):
    """A plan marked for a live audit: what the device does after its answer (ADR 0024)."""

    id: str = Field(description="The audit's id: send it as the tail request's 'Qpart-Audit' header.")
    url: str = Field(description="Where to POST, once every answer is in, the raw input of the one "
                     "sample of that tail request its answer names in the header 'Qpart-Audit-Sample' "
                     "(0-based): a float32 activation packet (kernels/wire.py) of shape [1, *input_shape].")
    input_shape: list[int] = Field(description="One sample's input shape (the model's).")
    expires_s: float = Field(description="Seconds from now the audit stays open (QPART_AUDIT_TTL_S).")


class AuditReceipt(_Strict):
    """The answer to an audit upload: taken, or dropped because the server is busy."""

    audit: str
    samples: int
    queued: bool = Field(description="False: dropped unchecked (the audit queue is full); counted.")


class TimeBreakdown(_Strict):
    """Predicted seconds per phase."""

    local: float
    transfer: float
    server: float
    total: float


class EnergyBreakdown(_Strict):
    """Predicted device joules per phase."""

    local: float
    transfer: float
    total: float


class CostBreakdown(_Strict):
    """The predicted terms of the objective for one plan."""

    time_s: TimeBreakdown
    energy_j: EnergyBreakdown
    server_cost: float
    objective: float
    transfer_bytes: int
    upload_encoding: UploadEncoding = Field(
        "identity", description="How the activation is sent in this plan (deflate, zstd: its mean "
        "compressed size, plus the device's time to compress it).")


class SegmentRef(_Strict):
    """Where the device gets the head segment."""

    id: str
    url: str
    size_bytes: int
    sha256: str
    held: bool = Field(description="The device said it holds this segment (no transfer counted).")
    runtime: HeadRuntime = Field(HeadRuntime.TORCH, description="The segment's form: 'torch' "
                                 "(safetensors) or 'onnx' (an ONNX model).")


class PlanResponse(_Strict):
    """The chosen plan, its predicted costs, and the baselines all-server and all-device."""

    plan_id: str
    model: str
    version: str
    cut: int
    cut_node: str
    cuts: int = Field(description="Number of legal cuts; the last one is all-device.")
    level: float
    metric: str = Field("top1-drop", description="What level bounds: the artifact's promise.metric "
                        "(e.g. top1-drop, top1-agreement); the demand was read in it.")
    weight_bits: dict[str, int]
    activation_bits: int
    group_size: int
    activation_shape: list[int]
    head_flops: int = Field(ge=0, description=(  # ADR 0020: an ONNX device's work budget for the head
        "The head's operations per sample (2 per multiply-add) as the artifact's cut declares them."))
    predicted: CostBreakdown
    all_server: CostBreakdown = Field(
        description="The cheapest plan at cut 0 (the server runs the whole model): the input sent "
        "as a packet or, where the request offered its input image and the model takes it, the "
        "image itself (ADR 0014).")
    all_device: CostBreakdown | None = Field(description="The cheapest plan at the last cut (the device runs "
                                             "the whole model); null where its runtime cannot (ADR 0019).")
    segment: SegmentRef | None
    infer_url: str | None = Field(description="Where to POST the activation packet (None if all-device).")
    upload_batch: int = Field(
        description="The most samples one upload may carry: its packet (coded or not) within the "
        "server's body limit (QPART_MAX_BODY_BYTES) and queue (QPART_MAX_QUEUE); a device with more "
        "inputs splits them into requests of at most this many (1 for an input-image plan).")
    upload_encoding: UploadEncoding = Field(
        description="How to send the packet: as is, or compressed with 'Content-Encoding: deflate' "
        "or 'zstd' (only when the request allowed it and it was priced so).")
    upload_content_type: Literal["application/octet-stream", "image/png", "image/webp"] = Field(
        "application/octet-stream", description="What to POST to infer_url: the activation packet "
        "(application/octet-stream), or, for an input-image plan (only when the request offered "
        "input_image), the device's input image: as a PNG (image/png) for 'input-png', as the WebP "
        "at the plan's quality (image/webp) for 'input-webp@<quality>'.")
    lossless: bool = Field(False, description=(
        "True when only lossless plans can serve the demand: no quantized pattern is certified at a "
        "level this tight (too few check samples: the artifact's lossless_levels; or demand 0): float32."))
    input_image_plan: CostBreakdown | None = Field(
        None, description="The cheapest input-image plan the request's offer got (ADR 0014, 0015), "
        "priced as 'predicted' is; null where the request offered no image or the model takes none. "
        "It tells a device how far its image was from being sent: one whose image plans price far "
        "above its plans measures its images afresh less often (ADR 0016).")
    audit: AuditTicket | None = Field(
        None, description="Set when the request consented and this plan was marked for a live audit.")


class PatternInfo(_Strict):
    """One precomputed (cut, level) pattern and its segment."""

    pattern_id: str
    cut: int
    cut_node: str
    level: float
    weight_bits: dict[str, int]
    activation_bits: int
    group_size: int
    test_drop: float | None
    segment: SegmentRef | None
    infer_url: str | None
    upload_batch: int = Field(description="The most samples one upload of this pattern may carry "
                              "(the plan's field of the same name).")


class RuntimeCuts(_Strict):
    """Which cuts one device runtime can run, as calibration found by checking each cut's head."""

    cuts: list[int] = Field(description="The cuts it runs (cut 0, no head, always).")
    refused: dict[str, str] = Field(description="Cut (as a string) -> why this runtime cannot run it.")


class ModelInfo(_Strict):
    """A served model version: its cuts and every pattern (for operators and prefetching devices)."""

    model: str
    version: str
    cuts: int
    calibrated_cuts: list[int] = Field(description=(
        "The cuts the calibration validated, the only ones a plan is made at (ADR 0025: the others no "
        "plan in its envelope would choose)."))
    levels: list[float]
    metric: str = Field("top1-drop", description="What each level bounds (the artifact's promise.metric).")
    lossless_levels: list[float] = Field(description=(
        "Levels the calibration's check samples could not certify, kept lossless (float32) by "
        "`--uncertified lossless`: a demand at such a level is served without quantization."))
    runtimes: dict[str, RuntimeCuts] = Field(description=(
        "Per device runtime (torch, onnx; the browser runs onnx segments), the cuts it takes and why "
        "not the others; the planner never offers a runtime a cut it refuses."))
    server_tail_s: list[float] = Field(
        description="Per cut, what a lone request's tail takes on this server now: its batch-1 time "
                    "measured at start-up, corrected by what lone requests took lately.")
    server_decode_s: dict[str, list[float]] = Field(
        default_factory=dict, description="Per upload coding (identity, deflate, zstd), per cut: what "
                    "decoding one sample's activation packet (coding undone, codes dequantized) takes: the "
                    "median of the last 9 lone packets of that cut and coding once there are 3 (and the "
                    "newest is at most 5 minutes old), else of the last 9 of any cut and coding that are "
                    "at most 5 minutes old (if 3 are), else 0; the last cut, which uploads nothing, is 0. "
                    "Plans price it as server time beside the tail.")
    answer_bytes: int = Field(description="Bytes of a tail answer for one sample (JSON, top 5).")
    patterns: list[PatternInfo]


class TopK(_Strict):
    """One class and its softmax probability."""

    label: int = Field(description="The class index (its logit's position).")
    probability: float
    name: str | None = Field(None, description="The class name from the model card; absent when the "
                                               "card names no labels.")


class TailResult(_Strict):
    """Result for one sample."""

    logits: list[float]
    top_k: list[TopK]


class TailResponse(_Strict):
    """Result of a tail inference."""

    plan_id: str
    model: str
    version: str
    results: list[TailResult]
    queue_s: float
    compute_s: float


class ErrorBody(BaseModel):
    """Every error response: ``{"error": "<what is wrong and how to fix it>"}``."""

    error: str
