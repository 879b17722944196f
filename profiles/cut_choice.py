"""Which of a model's cuts a calibration validated, and why the others were left out (ADR 0025)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CutChoice(BaseModel):
    """The cuts a calibration validated: every one, the ones named, or (``envelope``) those a plan in
    an envelope of requests could choose, priced before validation (``offline.pruning``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["envelope", "all", "named"] = Field(description=(
        "envelope: the cuts whose predicted patterns come within the margin of the best plan somewhere "
        "in the envelope (qpart calibrate's default, --cuts auto); all: every legal cut (--cuts all); "
        "named: the cuts --cuts named, and cut 0."))
    calibrated: list[int] = Field(min_length=1, description=(
        "The cuts with patterns, in order; cut 0 (the all-server plan) always."))
    pruned: dict[str, str] = Field(default_factory=dict, description="Each cut left out (index) and why.")
    closest: dict[str, float] = Field(default_factory=dict, description=(
        "envelope: per cut, the least ratio of its cheapest predicted plan's objective to the best "
        "plan's over the envelope (1: the best somewhere); a cut pruned unprobed (its bound ruled it "
        "out: offline.cut_probing) is not listed, its reason gives the bound."))
    envelope: dict[str, object] | None = Field(None, description=(
        "envelope: the requests priced (devices, speeds, rates, presets, server speeds and price, "
        "segments held or not) and the margin."))
