"""Settings of the device runtime (``QPART_DEVICE_*`` environment variables or CLI options)."""

from __future__ import annotations

import os
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qpart.kernels.coding import Coding

_BOOL = TypeAdapter(bool)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str, *, strict: bool = False) -> str:
    """The origin ``scheme://host:port`` of an absolute http(s) URL, the port made explicit.

    ``strict``: the URL must be an origin alone (no path beyond ``/``, no query), as a setting names one.

    Raises:
        ValueError: not an absolute http(s) URL (or, strict, more than an origin).
    """
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
        scheme = ""
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) origin such as https://cdn.example.com")
    if strict and (parts.path not in ("", "/") or parts.query or parts.fragment or parts.username):
        raise ValueError(f"{url!r}: give the origin alone (scheme://host[:port]), without a path")
    return f"{scheme}://{parts.hostname}:{port or _DEFAULT_PORTS[scheme]}"


class DeviceSettings(BaseSettings):
    """Where the server is and how hard the device tries."""

    model_config = SettingsConfigDict(env_prefix="QPART_DEVICE_", frozen=True)

    server: str = Field("http://127.0.0.1:8000", description="Base URL of the QPART server.")
    token: SecretStr | None = Field(None, description="Bearer token for inference routes.")
    cache_dir: Path = Field(Path.home() / ".cache" / "qpart" / "segments", description="Segment cache.")
    cache_max_bytes: int = Field(256 << 20, ge=0, description="Segment cache size limit (LRU pruning).")
    timeout_s: float = Field(30.0, gt=0, description="Timeout of one HTTP request.")
    retries: int = Field(5, ge=0, le=20, description="Retries on 503/429/connection errors.")
    backoff_s: float = Field(0.2, gt=0, description="First backoff; doubles each retry, with jitter.")
    max_backoff_s: float = Field(10.0, gt=0, description="Longest single wait between retries.")
    rate_smoothing: float = Field(0.3, gt=0, le=1, description="Weight of the newest rate sample.")
    upload_codings: tuple[Coding, ...] = Field(
        tuple(Coding), description="Upload codings to offer (the plan says which pays); "
        "empty: always upload packets as is.")

    trusted_segment_hosts: tuple[str, ...] = Field(
        (), description="Origins other than the server's (scheme://host[:port], e.g. a CDN) that a plan "
        "may name for segment downloads; they are fetched without credentials, the sha256 checks them "
        "(ADR 0020). Any other origin in a plan, and any foreign tail URL, is refused.")
    answer_max_bytes: int = Field(
        16 << 20, gt=0, description="Most bytes of one answer (plan, tail result, metadata) after "
        "content decoding; a longer one is refused.")
    segment_max_bytes: int = Field(
        256 << 20, gt=0, description="Most bytes of one segment for the PyTorch device (the ONNX "
        "device uses OnnxSegmentLimits.max_bytes); a plan announcing more is refused before download.")
    transfer_deadline_s: float = Field(
        60.0, gt=0, description="Overall deadline of one transfer: all attempts of a request or "
        "download, the waits between them, and every read of the answer's head and body, beyond the "
        "per-read timeout; a segment download gets its size at transfer_min_rate_bps on top.")
    transfer_min_rate_bps: float = Field(
        256e3, gt=0, description="Slowest rate (bit/s) a segment download is given time for: its "
        "deadline is transfer_deadline_s + size × 8 / this.")
    head_flops_margin: float = Field(
        16.0, ge=1, description="An ONNX head's work budget is the plan's declared head FLOPs times "
        "this (the dequantization of packed weights adds up to about 9 times a linear layer's own "
        "FLOPs); a segment whose estimated operations per sample are over it is refused before it "
        "runs (ADR 0020).")
    head_max_flops: int = Field(
        1 << 34, gt=0, description="Most operations per sample an ONNX head may ask for, whatever the "
        "plan declares (a server that declares no FLOPs, or lies about them, gets this budget).")
    head_deadline_s: float = Field(
        10.0, gt=0, description="Fixed part of an ONNX head run's deadline; a run of N samples gets N × "
        "its estimated operations per sample at head_min_flops_per_s on top. A run past it is "
        "stopped and its segment deleted from the cache.")
    head_min_flops_per_s: float = Field(
        1e8, gt=0, description="Slowest rate (operations per second) an ONNX head run is given time for "
        "in its deadline.")

    offer_input_image: bool = Field(
        True, description="When classifying one image file, offer the server the image itself as a "
        "PNG (ADR 0014): the planner may then choose to have it uploaded and preprocessed on the "
        "server, when that costs less than running a head here; false: never.")

    audit: bool = Field(
        False, description="Consent to live audits of the accuracy promise (ADR 0024): where the server "
        "marks a plan (QPART_AUDIT_RATE), the device uploads the raw input of that plan's first tail "
        "request after its answer, for the server to compare the float model's answer with the one it "
        "gave (then discarded, unless the server keeps disagreeing inputs: QPART_AUDIT_KEEP_DIR). "
        "Off: the device never sends its input.")

    @field_validator("server")
    @classmethod
    def _server_url(cls, server: str) -> str:
        """An absolute http(s) URL (a base path is kept), so a bare ``host:port`` is refused here,
        not later as a plan naming another origin."""
        try:
            origin_of(server)
        except ValueError:
            raise ValueError(f"{server!r} is not an http(s) URL; give the server's base URL, "
                             "e.g. http://127.0.0.1:8000") from None
        return server

    @field_validator("trusted_segment_hosts")
    @classmethod
    def _origins(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        """Each entry made a canonical origin (``scheme://host:port``); a path or query is refused."""
        return tuple(dict.fromkeys(origin_of(h, strict=True) for h in hosts))

    @field_validator("upload_codings")
    @classmethod
    def _once_each(cls, codings: tuple[Coding, ...]) -> tuple[Coding, ...]:
        """Each coding once, in the given order (the server refuses a longer list)."""
        return tuple(dict.fromkeys(codings))

    @model_validator(mode="before")
    @classmethod
    def _deprecated_upload_deflate(cls, data: Any) -> Any:
        """Honour ``QPART_DEVICE_UPLOAD_DEFLATE`` (before zstd uploads, ADR 0007) when
        ``QPART_DEVICE_UPLOAD_CODINGS`` is unset, as it meant then: false offers no coding, true
        deflate alone (which servers from before zstd understand). A :class:`FutureWarning`, which
        Python shows by default, tells the user to move."""
        old = os.environ.get("QPART_DEVICE_UPLOAD_DEFLATE")
        if old is None or not isinstance(data, dict):
            return data
        if "upload_codings" in data:
            warnings.warn("QPART_DEVICE_UPLOAD_DEFLATE is ignored: upload_codings is set too",
                          FutureWarning, stacklevel=2)
            return data
        try:
            flag = _BOOL.validate_python(old.strip())  # pydantic's reading of a boolean setting
        except ValidationError:
            raise ValueError(f"QPART_DEVICE_UPLOAD_DEFLATE={old!r}: use QPART_DEVICE_UPLOAD_CODINGS "
                             "instead, e.g. '[]' (upload as is) or '[\"deflate\",\"zstd\"]'") from None
        warnings.warn("QPART_DEVICE_UPLOAD_DEFLATE is deprecated: use QPART_DEVICE_UPLOAD_CODINGS "
                      "('[\"deflate\"]' as before, '[\"deflate\",\"zstd\"]' to offer zstd too, '[]' "
                      "to upload as is)", FutureWarning, stacklevel=2)
        return {**data, "upload_codings": (Coding.DEFLATE,) if flag else ()}
