"""The device's typed view of the server's answers: a plan (``POST /v1/plan``), a tail answer and
the model card's labels of ``GET /v2/models/{m}``.

Each model has the name of the server's wire model it mirrors (``server.schemas``: ``PlanResponse``,
``TailResponse``, ...) but is its own class, since the device never imports the server. Fields the
server adds later are ignored; the ones the device reads are validated on arrival.
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpart.client.errors import ServerAnswerError
from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.models.errors import PreprocessError
from qpart.models.image_codecs import webp_encoder
from qpart.models.preprocess import FASHION_MNIST_SPEC, PreprocessSpec, pixel_table

UploadEncoding = Coding | Literal["identity"]
"""How an activation packet is sent: a content coding (:class:`kernels.coding.Coding`) or as is."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PacketFormat(_Wire):
    """How the device quantizes, packs and uploads the head's activation."""

    activation_bits: int = Field(ge=1, le=32, description="Bits per activation value; 32 is float32.")
    group_size: int = Field(ge=1, description="Values per quantization group.")
    upload_encoding: UploadEncoding = Field("identity", description="Content-Encoding of the upload.")


class HeadSpec(_Wire):
    """Which head the device builds: a model version cut at one of its legal cuts."""

    model: str
    version: str
    cut: int = Field(ge=0)
    cut_node: str = Field(description="The graph node the cut falls after; the device's must agree.")
    cuts: int = Field(ge=1, description="Number of legal cuts; the last one is all-device.")


class SegmentRef(_Wire):
    """Where the device gets the head's tensors."""

    id: str
    url: str
    size_bytes: int = Field(ge=0)
    sha256: str
    held: bool = Field(description="The device said it holds this segment.")
    runtime: HeadRuntime = Field(HeadRuntime.TORCH, description="The segment's form (servers before "
                                 "ONNX segments send only 'torch' ones, without the field).")


class TimeBreakdown(_Wire):
    """Predicted seconds per phase."""

    local: float
    transfer: float
    server: float
    total: float


class EnergyBreakdown(_Wire):
    """Predicted device joules per phase."""

    local: float
    transfer: float
    total: float


class CostBreakdown(_Wire):
    """The predicted terms of the objective for one plan."""

    time_s: TimeBreakdown
    energy_j: EnergyBreakdown
    server_cost: float
    objective: float
    transfer_bytes: int
    upload_encoding: UploadEncoding = "identity"


AUDIT_HEADER = "Qpart-Audit"
"""The tail request's header that names the audit its answer belongs to (ADR 0024)."""
AUDIT_SAMPLE_HEADER = "Qpart-Audit-Sample"
"""The tail answer's header that names which of the request's samples (0-based) the audit checks."""


class AuditTicket(_Wire):
    """The plan is marked for a live audit (ADR 0024): after the answer, the raw input of the tail
    request that carried ``Qpart-Audit: <id>`` goes to ``url``."""

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    url: str = Field(max_length=2048)
    input_shape: list[int] = Field(description="One sample's input shape (the model's).")
    expires_s: float = Field(description="Seconds the server keeps the audit open after the plan.")


class AuditReceipt(_Wire):
    """The server took an audit's input (``queued``: false when it dropped it unchecked, busy)."""

    audit: str
    samples: int
    queued: bool


class PlanResponse(HeadSpec, PacketFormat):
    """The server's plan: the head to build, how to send its activation, and where."""

    plan_id: str
    level: float = Field(description="The accuracy level of the chosen pattern, in ``metric``.")
    metric: str = Field("top1-drop", description="What the level bounds (e.g. top1-drop, top1-agreement; "
                        "servers before it: top1-drop).")
    weight_bits: dict[str, int] = Field(description="Bits of each quantized head tensor.")
    activation_shape: list[int] = Field(description="One sample's activation at the cut.")
    head_flops: int | None = Field(None, ge=0, description="The head's FLOPs per sample as the model "
                                   "card declares them; an ONNX device budgets the segment's work from "
                                   "it (ADR 0020; servers before it: None, the device's cap alone).")
    predicted: CostBreakdown
    all_server: CostBreakdown | None = None
    all_device: CostBreakdown | None = None
    segment: SegmentRef | None
    infer_url: str | None = Field(description="Where to POST the activation packet (None: all-device).")
    upload_batch: int | None = Field(None, ge=1, description="The most samples one upload may carry "
                                     "within the server's body limit (servers before it: None).")
    upload_content_type: Literal["application/octet-stream", "image/png", "image/webp"] = Field(
        "application/octet-stream", description="What to POST to infer_url: the packet, or for the "
        "input-image plan (ADR 0014; servers before it never send it) the image as a PNG, or for "
        "a lossy one (ADR 0015) as the WebP at the plan's quality.")
    input_image_plan: CostBreakdown | None = Field(
        None, description="The cheapest input-image plan the offer got (ADR 0016; absent: no offer, or a "
        "server before it).")
    lossless: bool = Field(False, description="Only lossless (float32) plans serve the demand: the "
                           "calibration certified no quantized pattern that tight (absent: a server "
                           "before it).")
    audit: AuditTicket | None = Field(None, description="Set when the device consented (QPART_DEVICE_AUDIT) "
                                      "and the server marked the plan for a live audit.")


class TopK(_Wire):
    """One class and its softmax probability."""

    label: int
    probability: float
    name: str | None = Field(None, description="The class name from the model card (servers before it, "
                                               "or a card without labels: absent).")


class ModelMetadata(_Wire):
    """What the device reads of ``GET /v2/models/{m}``: the parameters holding the card's declarations."""

    parameters: dict[str, bool | int | float | str] = Field(default_factory=dict)

    def _json(self, key: str) -> object:
        """The parameter ``key`` parsed as JSON (None: absent; a non-JSON value: ``...``, which no
        caller accepts)."""
        raw = self.parameters.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw) if isinstance(raw, str) else ...
        except ValueError:
            return ...

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The card's class names in logit order (None: the card names none, or the server predates them).

        Raises:
            ServerAnswerError: ``labels`` is not a JSON list of strings.
        """
        names = self._json("labels")
        if names is None:
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ServerAnswerError("the server's model metadata has labels that are not a JSON list of "
                                    "names; update the client or the server")
        return tuple(names)

    @property
    def preprocess(self) -> PreprocessSpec | None:
        """The card's preprocessing, by which image files become the model's input (None: the card
        declares none, or the server predates it).

        Raises:
            ServerAnswerError: ``preprocess`` is not a JSON object holding a valid spec.
        """
        spec = self._json("preprocess")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise ServerAnswerError("the server's model metadata has a preprocess that is not a JSON object; "
                                    "update the client or the server")
        try:
            parsed = PreprocessSpec.from_mapping(spec)
            pixel_table(parsed)  # a spec whose values overflow float32 is the server's fault too
        except PreprocessError as exc:
            raise ServerAnswerError(f"the server's model metadata: {exc}") from exc
        return parsed

    @property
    def image_qualities(self) -> list[tuple[int, float]]:
        """The lossy input-image plan's promised WebP qualities with their tightest levels (ADR
        0015), lowest quality first: those whose promise is for this device's own encoder
        (:func:`~qpart.models.image_codecs.webp_encoder`: another libwebp or Pillow makes other
        bytes at the same quality, which the calibration never measured). Empty: none, or the
        server predates them.

        Raises:
            ServerAnswerError: ``image_qualities`` is not a JSON list of {codec, quality, level,
                encoder}.
        """
        rungs = self._json("image_qualities")
        if rungs is None:
            return []
        wrong = ServerAnswerError("the server's model metadata has image_qualities that are not a JSON "
                                  "list of {codec, quality, level, encoder}; update the client or the server")
        if not isinstance(rungs, list):
            raise wrong
        out = []
        for r in rungs:
            if not isinstance(r, dict):
                raise wrong
            quality, level, encoder = r.get("quality"), r.get("level"), r.get("encoder")
            if (not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100
                    or not isinstance(level, int | float) or isinstance(level, bool) or not 0 <= level < 1
                    or not isinstance(encoder, str | None)):
                raise wrong
            # another codec a newer server offers, or another encoder's promise (or one that names
            # none: a server from before it published them): not this device's to use
            if r.get("codec") == "webp" and encoder == webp_encoder():
                out.append((quality, float(level)))
        return sorted(out)

    @property
    def input_spec(self) -> PreprocessSpec:
        """How image files become the model's input: the card's :attr:`preprocess`, or for a card
        without one the reference models' 28×28 grayscale in [0, 1]."""
        return self.preprocess or FASHION_MNIST_SPEC


class TailResult(_Wire):
    """One sample's result: its logits and, from the server, its most likely classes."""

    logits: list[float]
    top_k: list[TopK] = Field(default_factory=list)


class TailResponse(_Wire):
    """The server's answer to an uploaded activation packet."""

    plan_id: str
    model: str
    version: str
    results: list[TailResult]
    queue_s: float = Field(0.0, description="Seconds the request waited for a batch.")
    compute_s: float = Field(0.0, description="Seconds of the tail's batch.")


Answer = TypeVar("Answer", bound=_Wire)


def parse_answer(kind: type[Answer], body: bytes) -> Answer:
    """``body`` (JSON) as ``kind``; a body this client cannot read raises :class:`ServerAnswerError`."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise ServerAnswerError(f"the server's {kind.__name__} does not read as this client expects "
                                f"({where}: {first['msg']}); update the client or the server") from exc
