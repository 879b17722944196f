"""Device profiles: what the planner needs to know of a device's compute, energy and radio.

Shipped presets live in ``profiles/devices/*.json``; a request may also carry a profile inline.
A profile measured by ``qpart device profile`` adds per-cut head times, which the planner uses
instead of the FLOP estimate, and its upload-coding times.

Schema 2 (ADR 0008) holds a model's coding times in one map keyed by
:class:`~kernels.coding.Coding` (``coding_s``); schema 1 had a field per coding (``deflate_s``,
``zstd_s``). Both spellings are read, in files and in plan requests.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpart.kernels.coding import Coding
from qpart.profiles.errors import ProfileFormatError, ProfileNotFoundError

DEVICES_DIR = Path(__file__).resolve().parent / "devices"
DEVICE_SCHEMA_VERSION = 2
_SCHEMA1_TIMES = {"deflate_s": Coding.DEFLATE, "zstd_s": Coding.ZSTD}  # schema 1's fields
MAX_CUTS = 256
"""The most cuts a profile's per-cut lists may hold: the shipped models have 9 to 35 legal cuts.
An inline profile is request data, parsed on the server's event loop: every list has a bound."""
MAX_NAME = 64  # a model name or version, as a plan request names them


class EnergyModel(StrEnum):
    """How compute energy on the device is estimated."""

    POWER = "power"
    """``E = P_compute * T_local`` (measured or datasheet power while computing)."""
    CYCLES = "cycles"
    """``E = kappa * f^2 * cycles`` with ``cycles = gamma * FLOPs`` (QPART Eq. 6)."""


# Seconds per bit width (1..32; JSON object keys are strings, so the schema says which ones).
CodingTimes = Annotated[
    dict[Annotated[int, Field(ge=1, le=32)], Annotated[float, Field(ge=0, le=10)]],
    Field(json_schema_extra={"propertyNames": {"pattern": "^([1-9]|[12][0-9]|3[0-2])$"}}),
]


class MeasuredHeads(BaseModel):
    """Head times of one model measured on the device by the timing profiler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(max_length=MAX_NAME, description="Model version the times were measured for.")
    # Bounded (an hour per head) so that every price stays finite: an inline profile is request data.
    head_s: list[Annotated[float, Field(ge=0, le=3600)]] = Field(
        max_length=MAX_CUTS, description="Seconds to run the head of each cut (index = cut index), batch 1."
    )
    encode_s: list[Annotated[float, Field(ge=0, le=3600)]] = Field(
        default_factory=list, max_length=MAX_CUTS,
        description="Seconds to quantize and pack the activation of each cut (8 bits, batch 1); "
                    "empty when not measured.")
    coding_s: dict[Coding, Annotated[list[CodingTimes], Field(max_length=MAX_CUTS)]] = Field(
        default_factory=dict,
        description="Per upload coding (kernels.coding): seconds to compress an upload per cut "
                    "(index = cut index) and activation bits (1..8, 32), batch 1. A coding absent: "
                    "uploads are not sent in it. Schema 1's deflate_s and zstd_s are read as these.")
    warmup: int = Field(ge=0, description="Warm-up iterations before timing.")
    repeats: int = Field(ge=1, description="Least timed rounds (each runs every cut once); the lists "
                                           "hold medians over the rounds.")
    min_seconds: float = Field(default=0.0, ge=0, le=3600,
                               description="Rounds went on until this long had passed.")

    @model_validator(mode="before")
    @classmethod
    def _schema1_fields(cls, data: Any) -> Any:
        """Schema 1's ``<coding>_s`` fields into ``coding_s`` (an empty list: not measured)."""
        if not (isinstance(data, dict) and _SCHEMA1_TIMES.keys() & data.keys()):
            return data
        coded = data.get("coding_s", {})
        if not isinstance(coded, dict):
            return data  # (the fields' own validation names what is wrong)
        coded = dict(coded)
        for name, coding in _SCHEMA1_TIMES.items():
            if name in data and coding in coded:
                raise ValueError(f"{coding} times given twice, as {name} and in coding_s: use coding_s")
            if data.get(name):
                coded[coding] = data[name]
        rest = {k: v for k, v in data.items() if k not in _SCHEMA1_TIMES}
        return {**rest, "coding_s": coded}

    def offering_only(self, codings: Collection[Coding]) -> MeasuredHeads:
        """A copy without the times of the codings not in ``codings``, as if never measured."""
        return self.model_copy(update={"coding_s": {c: t for c, t in self.coding_s.items() if c in codings}})

    def schema1_json(self) -> dict[str, Any]:
        """These figures as JSON, defaults left out, in schema 1's spelling where it has one
        (``deflate_s``, ``zstd_s``): servers of either schema read that, so a device sends it
        inline (a coding schema 1 lacks stays in ``coding_s``)."""
        doc = self.model_dump(mode="json", exclude_defaults=True)
        coded: dict[str, Any] = doc.pop("coding_s", {})
        for name, coding in _SCHEMA1_TIMES.items():
            if coding.value in coded:
                doc[name] = coded.pop(coding.value)
        return {**doc, "coding_s": coded} if coded else doc


class DeviceProfile(BaseModel):
    """Compute, energy and radio figures of one device class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[2] = 2
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    description: str = Field(default="", max_length=500)
    sources: list[Annotated[str, Field(max_length=500)]] = Field(default_factory=list, max_length=20,
                               description="Where the figures come from.")
    flops_per_s: float = Field(ge=1e3, le=1e15, description="Sustained FLOP/s for CNN inference, batch 1.")
    power_compute_w: float = Field(gt=0, le=1e3, description="Power drawn while computing (W).")
    power_tx_w: float = Field(gt=0, le=1e3, description="Radio power while transferring (W).")
    energy_model: EnergyModel = EnergyModel.POWER
    cpu_hz: float = Field(default=1.5e9, gt=0, le=1e11, description="Clock for the cycles model.")
    kappa: float = Field(default=3e-27, ge=0, le=1e-20, description="Switched capacitance (J/Hz^2/cycle).")
    cycles_per_flop: float = Field(default=5.0, gt=0, le=1e4, description="gamma_local of QPART.")
    rtt_s: float = Field(default=0.01, ge=0, le=10, description="Round-trip time to the server (s).")
    measured: dict[Annotated[str, Field(max_length=MAX_NAME)], MeasuredHeads] = Field(
        default_factory=dict, max_length=64, description="Per model: head times measured on the device."
    )

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A schema 1 profile as schema 2 (its measured times' old fields: :class:`MeasuredHeads`)."""
        if isinstance(data, dict) and data.get("schema_version") == 1:
            return {**data, "schema_version": DEVICE_SCHEMA_VERSION}
        return data

    def compute_energy_j(self, seconds: float, flops: float) -> float:
        """Energy (J) of computing ``flops`` in ``seconds`` on this device."""
        if self.energy_model is EnergyModel.CYCLES:
            return self.kappa * self.cpu_hz**2 * self.cycles_per_flop * flops
        return self.power_compute_w * seconds


def load_device_profile(path: Path) -> DeviceProfile:
    """Read and validate a device profile JSON file."""
    try:
        return DeviceProfile.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise ProfileNotFoundError(f"no device profile at {path}") from exc
    except ValidationError as exc:
        raise ProfileFormatError(f"{path} is not a valid device profile: {exc}") from exc


def builtin_devices() -> dict[str, DeviceProfile]:
    """The shipped presets, by name."""
    return {p.name: p for p in (load_device_profile(f) for f in sorted(DEVICES_DIR.glob("*.json")))}


def get_device(name: str) -> DeviceProfile:
    """A shipped preset by name, or :class:`ProfileNotFoundError` listing the known ones."""
    presets = builtin_devices()
    if name not in presets:
        raise ProfileNotFoundError(f"unknown device profile '{name}'; known: {', '.join(sorted(presets))}")
    return presets[name]


def save_device_profile(profile: DeviceProfile, path: Path) -> None:
    """Write a profile atomically (temporary file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(profile.model_dump(mode="json"), indent=2) + "\n")
    tmp.replace(path)
