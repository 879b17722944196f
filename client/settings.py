"""Settings of the device runtime (``QPART_DEVICE_*`` environment variables or CLI options)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qpart.kernels.coding import Coding

_BOOL = TypeAdapter(bool)


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

    offer_input_image: bool = Field(
        True, description="When classifying one image file, offer the server the image itself as a "
        "PNG (ADR 0014): the planner may then choose to have it uploaded and preprocessed on the "
        "server, when that costs less than running a head here; false: never.")

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
