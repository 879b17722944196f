"""The HTTP layer's answers built from the engine's results: links are made here, from the route
table (:mod:`server.api.paths`), never in the engine."""

from __future__ import annotations

from typing import Literal

from qpart.models.image_codecs import parse_rung_id
from qpart.profiles.artifacts import Pattern
from qpart.server.api import paths
from qpart.server.audit import Ticket
from qpart.server.engine import ModelView, PlanChoice
from qpart.server.planning import webp
from qpart.server.planning.images import CONTENT_TYPE, INPUT_PNG
from qpart.server.schemas import AuditTicket, ModelInfo, PatternInfo, PlanResponse, RuntimeCuts, SegmentRef
from qpart.server.store.catalog import LoadedModel
from qpart.server.store.segment_index import SegmentEntry, runtime_table


class Links:
    """URLs of segments and tail routes, under ``public_url`` (empty: relative URLs)."""

    def __init__(self, public_url: str) -> None:
        self.base = public_url.rstrip("/")

    def segment(self, segment_id: str) -> str:
        """Where a segment is downloaded."""
        return self.base + paths.SEGMENT.format(segment_id=segment_id)

    def tail_infer(self, model: LoadedModel, pattern: Pattern) -> str | None:
        """Where a pattern's activation packets go (None: the last cut has no tail)."""
        if pattern.cut == len(model.cuts) - 1:
            return None
        return self.base + paths.TAIL_INFER.format(model=model.name, version=model.version,
                                                   pattern_id=pattern.pattern_id)

    def audit(self, ticket: Ticket | None, model: LoadedModel) -> AuditTicket | None:
        """Where an audited plan's device uploads its input (None: the plan is not audited)."""
        if ticket is None:
            return None
        return AuditTicket(id=ticket.id, url=self.base + paths.AUDIT.format(audit_id=ticket.id),
                           input_shape=list(model.artifact.input_shape), expires_s=ticket.ttl_s)

    def segment_ref(self, entry: SegmentEntry | None, held: bool = False) -> SegmentRef | None:
        """A segment's reference in an answer (None without a segment)."""
        if entry is None:
            return None
        return SegmentRef(id=entry.segment_id, url=self.segment(entry.segment_id), size_bytes=entry.size,
                          sha256=entry.segment_id, held=held, runtime=entry.runtime)


def plan_response(choice: PlanChoice, links: Links) -> PlanResponse:
    """A plan as the device reads it."""
    model, chosen, p = choice.model, choice.chosen, choice.chosen.pattern
    held = chosen.segment_id is not None and chosen.segment_id in choice.held
    return PlanResponse(
        plan_id=f"{model.name}@{model.version}/{p.pattern_id}", model=model.name,
        version=model.version, cut=p.cut, cut_node=model.cuts[p.cut].node, cuts=len(model.cuts),
        level=p.level, metric=model.artifact.metric, weight_bits=p.weight_bits,
        activation_bits=p.activation_bits, group_size=p.group_size,
        activation_shape=list(model.cuts[p.cut].shape),
        head_flops=model.artifact.cuts[p.cut].head_flops,
        predicted=chosen.costs, all_server=choice.all_server.costs,
        all_device=None if choice.all_device is None else choice.all_device.costs,
        segment=links.segment_ref(choice.segment, held), infer_url=links.tail_infer(model, p),
        upload_batch=choice.upload_batch,
        upload_encoding=chosen.costs.upload_encoding,
        upload_content_type=upload_content_type(p.pattern_id),
        input_image_plan=None if choice.image is None else choice.image.costs, lossless=choice.lossless,
        audit=links.audit(choice.audit, model),
    )


def upload_content_type(pattern_id: str) -> Literal["application/octet-stream", "image/png", "image/webp"]:
    """What a plan's device POSTs: an activation packet, or the image of an input-image plan."""
    if pattern_id == INPUT_PNG:
        return CONTENT_TYPE
    if parse_rung_id(pattern_id) is not None:
        return webp.CONTENT_TYPE
    return "application/octet-stream"


def model_info_response(view: ModelView, links: Links) -> ModelInfo:
    """Every pattern of a model version with its segment reference."""
    model = view.model
    patterns = [PatternInfo(
        pattern_id=p.pattern_id, cut=p.cut, cut_node=model.cuts[p.cut].node, level=p.level,
        weight_bits=p.weight_bits, activation_bits=p.activation_bits, group_size=p.group_size,
        test_drop=p.test_drop, segment=links.segment_ref(entry), infer_url=links.tail_infer(model, p),
        upload_batch=view.upload_batch.get(p.pattern_id, 1))
        for p, entry in view.patterns]
    levels = sorted({p.level for p in model.artifact.patterns})
    runtimes = {name: RuntimeCuts.model_validate(row) for name, row in runtime_table(model).items()}
    return ModelInfo(model=model.name, version=model.version, cuts=len(model.cuts),
                     calibrated_cuts=model.artifact.calibrated_cuts, levels=levels,
                     metric=model.artifact.metric,
                     lossless_levels=list(model.artifact.lossless_levels), runtimes=runtimes,
                     server_tail_s=view.server_tail_s, server_decode_s=view.server_decode_s,
                     answer_bytes=view.answer_bytes, patterns=patterns)
